"""``--overhead-header``: the sidecar's own time on a captured call, in a ``Server-Timing`` header of
its reply, for an operator to read (docs/speed.md, "Overhead by part"). Off by default: the agent
gets the upstream's bytes, and a header it did not ask for is bytes it did not ask for.

A header leaves with the reply's head, so it says what is known then: the request's handling and
the upstream connection (the sidecar's parts), and the upstream's own time to its head. What comes
after the head (the parse, the line, its fsync) is in ``mcc_call_overhead_seconds`` by part.
``Server-Timing`` is the W3C field for this (browsers' developer tools and curl -v show it); LiteLLM
sends its overhead in a header of its own name.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, Optional

from ...call import CallHooks
from ._declaration import Feature, Option, SettingsBase

#: The header's name (the agent never sees it unless the operator turned it on).
SERVER_TIMING = b"Server-Timing"


class _ServerTiming(CallHooks):
    __slots__ = ()

    async def upstream_head(self, call: Any, reply: Any) -> Any:
        overhead = call.overhead
        request, connect = overhead.request or 0.0, overhead.connect or 0.0
        upstream = max(overhead.head_at - overhead.started - request - connect, 0.0)
        own = perf_counter() - overhead.head_at  # The features' work on the head so far.
        reply.headers.append((SERVER_TIMING, b"mcc-request;dur=%.3f, mcc-connect;dur=%.3f, mcc-head;dur=%.3f, "
                              b"upstream;dur=%.3f" % (request * 1e3, connect * 1e3, own * 1e3, upstream * 1e3)))
        return reply


class OverheadHeaderFeature(Feature):
    name = "overhead header"
    options = (Option("overhead_header", bool, False, "Add a Server-Timing header to each captured call's reply: the "
                      "sidecar's time on the request, the upstream connection and the head, and the upstream's time "
                      "to its head, in ms (off by default: the agent gets the upstream's bytes).", "Capture"),)

    @classmethod
    def check(cls, settings: SettingsBase) -> None:
        if settings.overhead_header and not settings.capture_on:
            raise ValueError("--overhead-header times captured calls, and capture is off: pass --capture-dir DIR")

    @classmethod
    def wanted(cls, settings: SettingsBase) -> bool:
        return bool(settings.overhead_header)

    def prepare(self) -> None:
        self.hooks = _ServerTiming()

    def call_hooks(self, route: Any) -> Optional[CallHooks]:
        return self.hooks
