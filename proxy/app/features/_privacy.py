"""Privacy of what is captured (docs/privacy.md): redaction rules, a hook and the metrics-only form,
applied to every captured line before anything is written (`proxy.privacy`)."""

from __future__ import annotations

import re
import secrets
from typing import TYPE_CHECKING, Optional

from capture import RedactionConfigError

from ...privacy import Redaction, RedactionMetrics, load_redaction
from ._declaration import Feature, Option, SettingsBase

if TYPE_CHECKING:
    from ...call import CallHooks, Route

_PRIVACY = "Privacy"


def _a_key(value: Optional[str]) -> Optional[str]:
    if value is not None and not re.fullmatch(r"(?:[0-9a-fA-F]{2}){32,}", value.strip()):
        raise ValueError("must be hex of 32 bytes or more (`openssl rand -hex 32` makes one)")
    return None if value is None else value.strip()


class PrivacyFeature(Feature):
    """``--redact``, ``--redact-hook``, ``--privacy``: first of a captured call's hooks, so every
    later one, and the line, see the redacted fields."""

    name = "privacy"
    options = (
        #: A YAML file of rules (``rules: [{name, pattern}]``), each match replaced by
        #: ``[REDACTED:<name>:<tag>]`` in every line before it is written.
        Option("redact", str | None, None, "Redaction rules (YAML: rules: [{name, pattern}]): every match in what is "
               "captured is replaced by [REDACTED:<name>:<tag>] before it is written; a rule that does not compile "
               "stops the start (docs/privacy.md).", _PRIVACY, metavar="FILE", yaml_hint=True),
        #: ``module:function``: a callable given every text value (after the rules), returning its
        #: redacted text; one that raises or runs past ``redact_hook_budget`` seconds leaves the line in
        #: metrics-only form, marked ``redaction_failed``.
        Option("redact_hook", str | None, None, "A callable given every captured text value (after the rules), "
               "returning it redacted; one that raises or runs past --redact-hook-budget leaves the line in "
               "metrics-only form, marked redaction_failed.", _PRIVACY, metavar="MODULE:FUNCTION", yaml_hint=True),
        Option("redact_hook_budget", float, 1.0, "Seconds the redaction hook may take per line, from the moment the "
               "line is ready (default 1).", _PRIVACY, bounds={"gt": 0, "le": 60}),
        #: Lines redacted by the hook at once, each on its own thread from the moment it is ready: a
        #: hook past its budget keeps a thread until it returns, so size this to the calls in flight;
        #: with every thread so taken a new line is written metrics-only.
        Option("redact_hook_workers", int, 16, "Lines the redaction hook works on at once, each on a thread of its "
               "own (default 16; a hook past its budget keeps its thread until it returns).", _PRIVACY,
               bounds={"ge": 1, "le": 1024}),
        #: ``full`` (the default), or ``metrics-only``: ids, timing, status, usage, finish reasons and
        #: tool names kept, every content value replaced, no raw text, no token files.
        Option("privacy", str, "full", "full (default), or metrics-only: lines keep ids, timing, status, usage, "
               "finish reasons and tool names; every content value is replaced; no raw text, no token files.",
               _PRIVACY, choices=("full", "metrics-only"), choices_said="full or metrics-only", yaml_hint=True),
        #: With ``--privacy metrics-only``: keep the token ids and logprob numbers (the token capture
        #: mode's files, and the lines' arrays). Token ids decode to the text.
        Option("privacy_keep_token_ids", bool, False, "With --privacy metrics-only: keep token ids and logprob "
               "numbers (token ids decode to the text).", _PRIVACY),
        #: The placeholders' key (hex, 32 bytes or more): sidecars given the same key name a rollout's
        #: values alike. Without it each sidecar draws its own, shared with its ``--workers``.
        Option("redact_key", str | None, None, secret=True, validate=_a_key,
               meaning="the redaction placeholders' key, hex of 32 bytes or more: sidecars given the same key name "
                       "a rollout's values alike (docs/privacy.md); an environment variable or the YAML file, never "
                       "a flag that `ps` would show"),
    )
    metrics = (RedactionMetrics,)

    @classmethod
    def check(cls, settings: SettingsBase) -> None:
        if settings.privacy_keep_token_ids and settings.privacy != "metrics-only":
            raise ValueError("--privacy-keep-token-ids (MCC_PRIVACY_KEEP_TOKEN_IDS) keeps token ids in a metrics-only "
                             "line; a full capture keeps them anyway: add --privacy metrics-only, or drop it")
        if (settings.redact or settings.redact_hook or settings.privacy != "full") and not settings.capture_on:
            raise ValueError("--redact, --redact-hook and --privacy apply to what is captured, and capture is off: "
                             "pass --capture-dir DIR (MCC_CAPTURE_DIR), with capture enabled")
        if settings.redact or settings.redact_hook:
            try:  # Fails closed: a rule or hook that cannot be used stops the start.
                load_redaction(settings.redact, settings.redact_hook)
            except RedactionConfigError as exc:
                raise ValueError(str(exc)) from None

    @classmethod
    def wanted(cls, settings: SettingsBase) -> bool:
        return settings.capture_on and bool(settings.redact or settings.redact_hook or settings.privacy != "full")

    def prepare(self) -> None:
        settings = self.settings
        rules, hook = load_redaction(settings.redact, settings.redact_hook)
        self.redaction = Redaction(self.host.metrics.feature(RedactionMetrics), rules, hook,
                                   settings.redact_hook_budget, settings.privacy == "metrics-only",
                                   settings.privacy_keep_token_ids,
                                   bytes.fromhex(settings.redact_key) if settings.redact_key
                                   else secrets.token_bytes(32), settings.redact_hook_workers)
        self.hooks = self.redaction.hooks()

    def call_hooks(self, route: "Route") -> "Optional[CallHooks]":
        return self.hooks

    def line_hooks(self) -> "tuple[CallHooks, ...]":
        return (self.hooks,)

    async def drain_lines(self) -> None:
        await self.redaction.quiet()  # Lines still being redacted join the journal first (a budget at most).
