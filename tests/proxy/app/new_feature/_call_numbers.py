"""A new feature, as an engineer adds one (docs/layout.md, "Adding a feature"): each captured call's
line numbered within its rollout. `tests/proxy/app/test_features.py` adds it to a copy of the
project -- this file as ``proxy/app/features/_call_numbers.py`` and one line in the feature list --
and nothing else."""

from __future__ import annotations

from collections import Counter as Tally
from typing import Any, Optional

import orjson
from prometheus_client import CollectorRegistry, Counter

from ...call import CallHooks
from ._declaration import Feature, Option, SettingsBase


class CallNumberMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.numbered = Counter("mcc_numbered_calls_total", "Captured calls numbered within their rollout.",
                                registry=registry)


class _Numbering(CallHooks):
    __slots__ = ("feature",)

    def __init__(self, feature: "CallNumbersFeature") -> None:
        self.feature = feature

    def line_fields(self, exchange: Any, fields: dict[str, Any]) -> None:
        tally = self.feature.tally
        tally[exchange.rollout_id] += 1
        fields["call_number"] = tally[exchange.rollout_id]
        self.feature.host.metrics.feature(CallNumberMetrics).numbered.inc()


class CallNumbersFeature(Feature):
    name = "call numbers"
    options = (Option("number_calls", bool, False, "Number each captured call's line within its rollout "
                      "(call_number; off by default).", "Capture"),)
    metrics = (CallNumberMetrics,)
    admin_paths = (("/-/call-numbers", "GET /-/call-numbers"),)

    @classmethod
    def check(cls, settings: SettingsBase) -> None:
        if settings.number_calls and not settings.capture_on:
            raise ValueError("--number-calls numbers captured calls, and capture is off: pass --capture-dir DIR")

    @classmethod
    def wanted(cls, settings: SettingsBase) -> bool:
        return bool(settings.number_calls)

    def prepare(self) -> None:
        self.tally: Tally[str] = Tally()
        self.hooks = _Numbering(self)

    def call_hooks(self, route: Any) -> Optional[CallHooks]:
        return self.hooks

    async def serve_admin(self, path: bytes, request: Any) -> Optional[tuple[int, bytes]]:
        return 200, orjson.dumps(dict(getattr(self, "tally", {})))
