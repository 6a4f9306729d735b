"""Side calls (docs/tokens.md): a captured call for another model than the rollout's policy model
(Claude Code's title and quota calls) is captured whole, marked ``side_call`` and never trained on
(`proxy.training.SideCalls`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ...training import SideCalls
from ._declaration import Feature, Option, SettingsBase

if TYPE_CHECKING:
    from ...call import CallHooks, Route


class SideCallsFeature(Feature):
    """Marks side calls before the token capture mode decides to take part in a call."""

    name = "side calls"
    options = (
        #: The rollouts' policy model (the model trained): a captured call for another model is a side
        #: call, marked and never trained on; unset: the model of each rollout's first call.
        Option("policy_model", str | None, None, "The model being trained: a call of a rollout for another model is "
               "a side call, captured whole, marked side_call and never trained on (default: the model of each "
               "rollout's first call).", "Training token ids", metavar="NAME"),
    )

    @classmethod
    def wanted(cls, settings: SettingsBase) -> bool:
        return settings.capture_on

    def prepare(self) -> None:
        self.rule = SideCalls(self.settings.policy_model, self.host.metrics)

    def call_hooks(self, route: "Route") -> "Optional[CallHooks]":
        return self.rule.hooks()
