"""The token capture mode (docs/tokens.md): every call it covers is sent asking for its sampled
token ids and logprobs, which are cut from the agent's reply and written as training-token files
(`proxy.training.TokenTraining`). With capture on it covers NeMo Gym's training path always, and
every call with ``--capture-tokens``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ...training import TokenCapture, TokenModeMetrics, TokenTraining
from ._declaration import Feature, Option, SettingsBase, absolute_directory
from ._side_calls import SideCallsFeature

if TYPE_CHECKING:
    from ...call import CallHooks, Route

TOKENS = "Training token ids"


class TokenModeFeature(Feature):
    """Every call it covers; a side call (`SideCallsFeature`'s rule, asked before the call is
    dispatched) takes no part."""

    name = "token capture mode"
    options = (
        #: Add to each captured request what vLLM needs to return the sampled token ids and their
        #: logprobs, and cut it from the agent's reply.
        Option("capture_tokens", bool, False, "Token capture mode: ask vLLM for every captured call's token ids and "
               "logprobs (added to the request, cut from the agent's reply; off by default).", TOKENS, yaml_hint=True),
        #: Where the training-token files go; the capture dir when unset.
        Option("token_dir", str | None, None, "Where the training-token files (<rollout_id>.tokens.jsonl, Gym's "
               "store) go; default: the capture dir.", TOKENS, metavar="DIR", validate=absolute_directory,
               default_said="the capture dir", yaml_hint=True),
    )
    metrics = (TokenModeMetrics,)

    @classmethod
    def check(cls, settings: SettingsBase) -> None:
        if settings.capture_tokens and not settings.capture_on:
            raise ValueError("--capture-tokens (MCC_CAPTURE_TOKENS) needs capture on, or it does nothing: "
                             "pass --capture-dir DIR (MCC_CAPTURE_DIR), with capture enabled")

    @classmethod
    def wanted(cls, settings: SettingsBase) -> bool:
        return settings.capture_on  # Gym's training path takes it even without --capture-tokens.

    def prepare(self) -> None:
        settings, host = self.settings, self.host
        metrics = host.metrics.feature(TokenModeMetrics)
        self.training = TokenTraining(metrics, TokenCapture(settings.token_dir or settings.capture_dir, metrics),
                                      settings.capture_tokens)
        #: A metrics-only line keeps no token ids unless asked (docs/privacy.md): then no call is covered.
        self.kept = settings.privacy != "metrics-only" or settings.privacy_keep_token_ids

    async def start(self) -> None:
        # A side call takes no part: the mode decides so itself, before the call is dispatched.
        side_calls = self.host.feature(SideCallsFeature)
        self.training.side_calls = side_calls.rule if side_calls is not None else None

    def call_hooks(self, route: "Route") -> "Optional[CallHooks]":
        if self.kept and self.training.covers(route.training_tokens):
            return self.training.hooks()
        return None
