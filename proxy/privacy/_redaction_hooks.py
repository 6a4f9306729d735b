"""Redaction in a call (docs/privacy.md): `RedactionHooks` redacts the line's fields first among the
call's hooks, on a writer thread, before the token capture mode writes its entries from them and
before the journal writes the line. A hook that raises or runs past its budget leaves the line in
metrics-only form, marked ``redaction_failed``, counted and logged without content: never the value
it was given."""

from __future__ import annotations

import concurrent.futures
import importlib
import logging
from typing import TYPE_CHECKING, Any, Callable, Optional

import yaml
from prometheus_client import CollectorRegistry, Counter

from capture import Redactor, RedactionConfigError, RolloutPlaceholders, load_rules, metrics_only

from ..call import CallHooks

if TYPE_CHECKING:
    from ..call import CallExchange

log = logging.getLogger("mcc.privacy")


class RedactionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.failures = Counter("mcc_redaction_failures_total", "Lines written in metrics-only form because "
                                "redaction failed (the hook raised or ran past its budget), by kind.", ["kind"],
                                registry=registry)
        self.redactions = Counter("mcc_redactions_total", "Values replaced by redaction, by rule (hook: the hook "
                                  "changed a text).", ["rule"], registry=registry)


def load_redaction(rules_file: Optional[str], hook: Optional[str]) -> tuple[tuple[Any, ...], Optional[Callable[[str], str]]]:
    """The rules of ``--redact FILE`` and the callable of ``--redact-hook module:function``;
    `RedactionConfigError` in one sentence for anything that cannot be used (fail closed)."""
    rules: tuple[Any, ...] = ()
    if rules_file is not None:
        try:
            with open(rules_file, encoding="utf-8") as handle:
                document = yaml.safe_load(handle)
        except (OSError, yaml.YAMLError) as exc:
            raise RedactionConfigError(f"--redact {rules_file}: {exc}") from None
        rules = load_rules(document, f"--redact {rules_file}")
    function = None
    if hook is not None:
        module_name, _, name = hook.partition(":")
        try:
            function = getattr(importlib.import_module(module_name), name) if name else None
        except (ImportError, AttributeError) as exc:
            raise RedactionConfigError(f"--redact-hook {hook}: {exc}") from None
        if not callable(function):
            raise RedactionConfigError(f"--redact-hook {hook}: expected module:function naming a callable")
    return rules, function


class Redaction:
    """The sidecar's redaction: what every line goes through."""

    def __init__(self, metrics: RedactionMetrics, rules: tuple[Any, ...], hook: Optional[Callable[[str], str]],
                 budget: float, metrics_only: bool, keep_token_ids: bool, key: bytes) -> None:
        self.metrics = metrics
        self.redactor = Redactor(rules, hook)
        self.budget = budget
        self.metrics_only = metrics_only
        self.keep_token_ids = keep_token_ids
        #: The placeholders' key (`RolloutPlaceholders`): shared by a supervisor's workers.
        self._key = key
        #: The hook runs here, so that a hook past its budget is left behind, not waited for.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="mcc-redact")

    def hooks(self) -> "RedactionHooks":
        return RedactionHooks(self)

    def placeholders(self, rollout_id: str) -> RolloutPlaceholders:
        return RolloutPlaceholders(self._key, rollout_id)

    def redact(self, rollout_id: str, fields: dict[str, Any]) -> None:
        """``fields`` redacted in place (on a writer thread)."""
        if self.metrics_only:
            metrics_only(fields, self.keep_token_ids)
            fields["privacy"] = "metrics-only"
            return
        placeholders = self.placeholders(rollout_id)
        try:
            if self.redactor.hook is None:
                counts = self.redactor.redact_line(fields, placeholders)
            else:
                copy = dict(fields)
                counts = self._pool.submit(self.redactor.redact_line, copy, placeholders).result(timeout=self.budget)
                fields.update(copy)
        except concurrent.futures.TimeoutError:
            self._failed(rollout_id, fields, "timeout", f"the redaction hook ran past its budget of {self.budget} s")
            return
        except Exception as exc:  # The hook's own failure: its message may hold content, so only its type is said.
            self._failed(rollout_id, fields, "error", f"the redaction hook raised {type(exc).__name__}")
            return
        if counts:
            fields["redactions"] = counts
            for rule, count in counts.items():
                self.metrics.redactions.labels(rule).inc(count)

    def _failed(self, rollout_id: str, fields: dict[str, Any], kind: str, said: str) -> None:
        metrics_only(fields, False)
        fields["redaction_failed"] = True
        self.metrics.failures.labels(kind).inc()
        log.warning("redaction of call %s of rollout %s failed: %s; its line is written in metrics-only form "
                    "(mcc_redaction_failures_total)", fields.get("model_call_id"), rollout_id, said,
                    extra={"rollout_id": rollout_id, "kind": kind})


class RedactionHooks(CallHooks):
    """Redaction's part in one call: the line phase, first among the call's hooks."""

    __slots__ = ("redaction",)

    def __init__(self, redaction: Redaction) -> None:
        self.redaction = redaction

    @property
    def line_on_writer_thread(self) -> bool:  # type: ignore[override]  # a property where the base has a class attribute
        """A hook's call (which may block up to its budget) never runs on the event loop; rules run
        where the journal builds the line (on the loop for a small call)."""
        return self.redaction.redactor.hook is not None

    def line_fields(self, exchange: "CallExchange", fields: dict[str, Any]) -> None:
        self.redaction.redact(exchange.rollout_id, fields)
