"""One response on a socket, as one call line (docs/wire.md, docs/files.md): the relay's own exchange, and a
bridged prewarm's.

A ``response.create`` opens it (the whole request it stands for, `Conversation`); each server
message is fed to the Responses reassembler as the SSE event a streamed ``POST`` would carry, so
the line is as complete as the same response over HTTP; `finish` makes the line durable, and the
relay sends the ending event's frame only after that.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

import orjson

from capture import StreamTap
from capture.journal import settles

from ..call import CallContext, CallExchange, CallHooks, Failure, submit_line
from ..http import ServerRequest
from ._events import ENDING_EVENTS, as_sse_event


class SocketFacts(CallHooks):
    """The line says which socket and turn it was: the ``websocket`` key."""

    __slots__ = ("facts",)

    def __init__(self, facts: dict[str, Any]) -> None:
        self.facts = facts

    def line_fields(self, exchange: Any, fields: dict[str, Any]) -> None:
        fields["websocket"] = self.facts


class SocketCall:
    """One response on a socket, from its ``response.create`` to its ending event."""

    def __init__(self, ctx: CallContext, rollout_id: str, upgrade: ServerRequest, body: dict[str, Any],
                 facts: dict[str, Any]) -> None:
        self.ctx = ctx
        self.facts = facts
        #: The whole request the turn stands for (`Conversation.whole_request`).
        self.request = body
        self.ended = False
        self.response: Optional[dict[str, Any]] = None
        exchange = self.exchange = CallExchange(
            rollout_id=rollout_id, dialect="responses", model_name=ctx.model_ref_name,
            request_body=dumps_body(body), request_headers=upgrade.headers, request_fields=upgrade.fields,
            correlation_headers=ctx.correlation_headers, raw_stream=ctx.raw_stream)
        exchange.parsed_request = body
        exchange.retries = ctx.retries
        exchange.start()
        exchange.status_code = exchange.upstream_status_code = 200
        exchange.tap = StreamTap("responses", None, compact_arrays=True)

    def feed(self, payload: bytes, event: Optional[dict[str, Any]]) -> bool:
        """One server message; True when it ends the response."""
        exchange = self.exchange
        exchange.mark_first_content()
        exchange.tap.feed(as_sse_event(payload, event))  # type: ignore[union-attr]  # a socket call's exchange has a tap
        kind = event.get("type") if event is not None else None
        if kind == "error" and type(event.get("status")) is int:  # type: ignore[union-attr]  # kind is set only when event is
            exchange.status_code = exchange.upstream_status_code = event["status"]  # type: ignore[index]  # kind is set only when event is
        if isinstance(event, dict) and isinstance(event.get("response"), dict):
            self.response = event["response"]
        self.ended = kind in ENDING_EVENTS
        return self.ended

    def cut_short(self, by_client: bool) -> None:
        """The socket closed before the response ended."""
        self.exchange.category_override = "cancelled" if by_client else None
        self.exchange.failure = (Failure("client", "cancelled", "the client closed the socket before the response ended")
                                 if by_client else
                                 Failure("upstream_response", "upstream_error", "the model server closed the socket "
                                         "before the response ended", None, True))

    async def finish(self) -> bool:
        """The line, durable (True) or failed (False: said and counted by the journal)."""
        journal = self.ctx.journal
        if journal is None:
            return True
        self.exchange.complete()
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        submit_line(journal, self.exchange, (*self.ctx.line_hooks, SocketFacts(self.facts)), settles(done))
        return await asyncio.shield(done)


def dumps_body(body: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # An integer beyond 64 bits: Python's json writes its digits.
        import json
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


__all__ = ["SocketCall", "SocketFacts", "dumps_body"]
