"""What every dialect's reassembler shares: the fold interface and JSON decoding of events."""

from __future__ import annotations

from typing import Any

import orjson

from ._sse import ServerSentEvent


class Reassembler:
    """A fold over one stream's events into the object the non-streaming endpoint returns.

    Subclasses implement `_on_payload`. Errors are data: a bad event is counted, never raised.
    """

    dialect = ""

    def __init__(self) -> None:
        #: True once the dialect's terminal event has been seen (DESIGN §6).
        self.terminal = False
        #: ``upstream_error`` / ``incomplete`` when the stream itself reported it (DESIGN §4).
        self.error_category: str | None = None
        #: Events whose data was not a JSON object.
        self.undecodable_events = 0

    def feed_event(self, event: ServerSentEvent) -> None:
        """Fold one event into the state; events after the terminal are not part of the reply."""
        if self.terminal:
            return
        try:
            payload = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            payload = None
        if type(payload) is not dict:
            self._on_undecodable(event)
            return
        # The event name decides; a stream without names (or a proxy that drops them) falls back
        # to the payload's `type`, which every dialect sets to the same value (DESIGN §6).
        event_type = event.event
        if event_type == "message" and isinstance(payload.get("type"), str):
            event_type = payload["type"]
        self._on_payload(event_type, payload)

    def result(self) -> dict[str, Any] | None:
        """The reassembled object: final after the terminal event, else the best partial one."""
        raise NotImplementedError

    def _on_payload(self, event_type: str, payload: dict[str, Any]) -> None:
        raise NotImplementedError

    def _on_undecodable(self, event: ServerSentEvent) -> None:
        # OpenAI-compatible servers (OpenRouter) end Responses streams with Chat's `[DONE]` too.
        if event.data.strip() != "[DONE]":
            self.undecodable_events += 1


def grow_list(items: list[Any], index: Any, filler: Any = None) -> bool:
    """Make ``items[index]`` addressable; False when ``index`` is not a sane list index."""
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 100_000:
        return False
    while len(items) <= index:
        items.append(filler() if callable(filler) else filler)
    return True
