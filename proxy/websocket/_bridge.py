"""The bridge (docs/wire.md): a Responses WebSocket served by the sidecar for an upstream that has none
(vLLM 0.33), each ``response.create`` sent as a streamed ``POST /v1/responses``.

Each response is an ordinary call (`proxy.call.forward`): the same phases, hooks (the token mode
adds its fields to the POST and cuts them from the reply), line and hold-back. Its "client" is
`EventFrames`, which writes the reply the call would write to an HTTP client as the socket's
messages: one text frame per SSE event, in order, the held terminal event's frame sent once the
line is durable. Where the HTTP reply and the socket differ:

- an HTTP error reply (4xx, 5xx, a local 502 or 504) becomes one ``error`` event with its status
  and the reply's own ``error`` object;
- a stream that breaks or ends before its terminal event is followed by an ``error`` event (the
  client would otherwise wait for an end that never comes); the socket stays open;
- a ``generate: false`` prewarm is answered by the sidecar (``response.created`` and
  ``response.completed`` with no output) and recorded with ``response_source: "local"``: vLLM
  has no such field, and the prewarm's input is remembered for the response that chains to it;
- ``previous_response_id`` of a response this socket answered is replaced by its whole context
  (`Conversation`), so the upstream needs no stored responses.

Responses on one socket are answered one at a time, in order (as the API does without
``stream_id``); a client that leaves mid-response cancels it (its line says so).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Callable, Optional

import orjson

from capture import SSEParser

from ..call import CallContext, Route, forward
from ..http import Headers, ServerRequest, ServerTunnel, websocket
from ._conversation import Conversation
from ._events import CREATE, ENDING_EVENTS, create_body, error_event, error_of_reply, parsed_message
from ._socket_call import SocketCall, SocketFacts, dumps_body

log = logging.getLogger("mcc.websocket")

#: Headers of the upgrade request that are the socket's, not a POST's.
_SOCKET_HEADERS = frozenset({b"upgrade", b"connection", b"sec-websocket-key", b"sec-websocket-version",
                             b"sec-websocket-extensions", b"sec-websocket-protocol", b"content-length",
                             b"content-type", b"accept", b"accept-encoding", b"transfer-encoding", b"origin"})
_ENDING_MARKERS = (b"response.completed", b"response.failed", b"response.incomplete", b'"error"')


class _WithHook:
    """The sidecar's call context, with one hook more for a bridged call (the line's `websocket`
    key). Reads through to the context itself, so what changes there (a drain's cut) is seen."""

    def __init__(self, ctx: CallContext, hook: SocketFacts) -> None:
        self._ctx = ctx
        self._hook = hook

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def hooks_for(self, route: Route) -> tuple[Any, ...]:
        return (*self._ctx.hooks_for(route), self._hook)


def switching_protocols_head(key: bytes) -> bytes:
    """The sidecar's own 101: no extension and no subprotocol agreed (permessage-deflate declined)."""
    return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: %s\r\n\r\n" % websocket.accept_value(key))


class EventFrames:
    """A bridged call's client: the HTTP reply the call writes, sent as the socket's text messages.

    Implements what the call and its body pump use of a reply's writer (`ReplyWriter`'s `start` /
    `write` / `end`, `reply`, `cork`) and of its connection (`abort`, `gone`, the write flow): it is
    its own `connection`."""

    def __init__(self, socket: ServerTunnel, on_response: Callable[[dict[str, Any]], None]) -> None:
        self._socket = socket
        self._on_response = on_response
        self._status = 0
        self._events: Optional[SSEParser] = None
        self._body: list[bytes] = []
        self._corked: Optional[list[bytes]] = None
        self.ended_response = False
        self.response_started = self.response_ended = False
        self.on_write_flow: Optional[Callable[[bool], None]] = None
        #: When the first body bytes were written (`ReplyWriter.first_body_at`: a call's ``first_byte``).
        self.first_body_at = 0.0
        socket.on_flow = self._flow

    def _flow(self, paused: bool) -> None:
        if self.on_write_flow is not None:
            self.on_write_flow(paused)

    @property
    def connection(self) -> "EventFrames":
        """What is not the reply's -- the socket's flow, whether it has gone, an abort -- is the frames' too."""
        return self

    @property
    def gone(self) -> bool:
        return self._socket.closed

    @property
    def writing_paused(self) -> bool:
        return self._socket.write_paused

    def start(self, status: int, reason: bytes, headers: Headers, chunked: bool) -> None:
        self._status, self.response_started = status, True
        content_type = next((value for name, value in headers if name.lower() == b"content-type"), b"")
        if 200 <= status < 300 and content_type.split(b";")[0].strip().lower() == b"text/event-stream":
            self._events = SSEParser()

    def flush_head(self) -> None:
        pass

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self.first_body_at:
            self.first_body_at = time.perf_counter()
        if self._events is None:
            self._body.append(data)
            return
        for event in self._events.feed(data):
            self._send_event(event.data.encode())

    def end(self, last: bytes = b"") -> None:
        self.write(last)
        if self._events is not None:
            for event in self._events.close():
                self._send_event(event.data.encode())
            if not self.ended_response:
                self._send(error_event(502, {"type": "upstream_error", "message": "the model server's stream ended "
                                             "before the response did (no response.completed)"}))
        elif not self.ended_response:
            self._answer_whole(b"".join(self._body))
        self.response_ended = True

    def reply(self, status: int, reason: bytes, headers: Headers, body: bytes) -> None:
        self.start(status, reason, headers, chunked=False)
        self.write(body)
        self.end()

    def abort(self) -> None:
        """The upstream broke off mid-reply: the socket says so, and stays open."""
        if not self.ended_response:
            self.ended_response = True
            self._send(error_event(502, {"type": "upstream_error", "message": "the model server's stream broke off "
                                         "before the response ended"}))
        self.response_ended = True

    def cork(self) -> None:
        if self._corked is None:
            self._corked = []

    def uncork(self) -> None:
        corked, self._corked = self._corked, None
        if corked:
            self._socket.write(b"".join(corked))

    # -- the socket's messages -------------------------------------------------------------------

    def _answer_whole(self, body: bytes) -> None:
        """A reply that was not a stream: an error event for an error, else the response whole."""
        self.ended_response = True
        parsed = parsed_message(body)
        if 200 <= self._status < 300 and parsed is not None and parsed.get("object") == "response":
            self._on_response(parsed)
            self._send(orjson.dumps({"type": "response.completed", "response": parsed}))
            return
        self._send(error_event(self._status if self._status >= 400 else 502, error_of_reply(self._status, body)))

    def _send_event(self, data: bytes) -> None:
        if data == b"[DONE]" or self.ended_response:
            return
        if any(marker in data for marker in _ENDING_MARKERS):
            event = parsed_message(data)
            if event is not None and event.get("type") in ENDING_EVENTS:
                self.ended_response = True
                if isinstance(event.get("response"), dict):
                    self._on_response(event["response"])
        self._send(data)

    def _send(self, message: bytes) -> None:
        frame = websocket.encode_frame(websocket.TEXT, message)
        if self._corked is not None:
            self._corked.append(frame)
        else:
            self._socket.write(frame)


class Bridge:
    """One client socket served by the sidecar; `run` until it closes."""

    def __init__(self, ctx: CallContext, request: ServerRequest, route: Route, socket: ServerTunnel) -> None:
        self.ctx = ctx
        self.request = request
        self.route = route
        self.socket = socket
        self.socket_id = uuid.uuid4().hex[:16]
        self.conversation = Conversation()
        self.turns = 0
        self._creates: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._answering = False
        socket.on_shutdown = self._shut_down
        self._post_headers = [(name, value) for name, value in request.headers if name.lower() not in _SOCKET_HEADERS]
        self._post_headers += [(b"Content-Type", b"application/json"), (b"Accept", b"text/event-stream"),
                               (b"Accept-Encoding", b"identity")]

    async def run(self) -> None:
        answering = asyncio.ensure_future(self._answer_in_turn())
        try:
            await self._read_client()
        finally:
            answering.cancel()  # A response in flight: the client left, its line says cancelled.
            try:
                await answering
            except asyncio.CancelledError:
                pass
            self.socket.close()

    async def _read_client(self) -> None:
        reader = websocket.FrameReader(masked=True, max_message_bytes=self.ctx.max_body_bytes)
        while True:
            data = await self.socket.read()
            if not data:
                return
            try:
                messages = reader.feed(data)
            except websocket.WebSocketError as error:
                self._close(error.code, error.reason)
                return
            for message in messages:
                if message.opcode == websocket.PING:
                    self.socket.write(websocket.encode_frame(websocket.PONG, message.payload))
                elif message.opcode == websocket.CLOSE:
                    code = websocket.close_code(message.payload)
                    self._close(code if code is not None else websocket.NORMAL_CLOSURE, "")
                    return
                elif message.opcode == websocket.TEXT:
                    self._take(message.payload)
                elif message.opcode == websocket.BINARY:
                    self._send_error(400, "invalid_request_error", "binary messages are not part of the Responses "
                                     "WebSocket mode: send response.create as a text message")

    def _take(self, payload: bytes) -> None:
        event = parsed_message(payload)
        if event is None or event.get("type") != CREATE:
            kind = event.get("type") if event is not None else None
            self._send_error(400, "invalid_request_error",
                             f"unsupported message type {kind!r}: this socket takes response.create"
                             if event is not None else "a message that is not a JSON object")
            return
        self._creates.put_nowait(event)

    async def _answer_in_turn(self) -> None:
        while True:
            event = await self._creates.get()
            self._answering = True
            try:
                await self._answer(event)
            finally:
                self._answering = False
            if self.socket.shutting_down and self._creates.empty():
                self._say_going_away()

    def _shut_down(self) -> None:
        """The sidecar drains: an idle socket is closed now (1001, going away), a busy one once its
        response has ended; the client reconnects to another sidecar."""
        if not self._answering and self._creates.empty():
            self._say_going_away()

    def _say_going_away(self) -> None:
        self._close(websocket.GOING_AWAY, "the sidecar is shutting down")
        self.socket.feed_eof()  # Ends the read loop: `run` closes the socket.

    async def _answer(self, event: dict[str, Any]) -> None:
        turn, self.turns = self.turns, self.turns + 1
        body, chained = self.conversation.whole_request(create_body(event))
        facts = {"mode": "bridge", "socket": self.socket_id, "turn": turn}
        if chained is not None:
            facts["previous_response_id"] = chained
        if event.get("generate") is False:
            await self._prewarm(body, facts)
            return
        frames = EventFrames(self.socket, lambda response: self.conversation.remember(response.get("id"),
                                                                                     body.get("input"), response))
        request = ServerRequest("POST", self.request.target, self._post_headers, True, True)
        request.body = dumps_body(body)
        await forward(_WithHook(self.ctx, SocketFacts(facts)), request, frames)  # type: ignore[arg-type]  # a call view with the hooks this forward needs

    async def _prewarm(self, body: dict[str, Any], facts: dict[str, Any]) -> None:
        """``generate: false``: nothing is generated; the socket answers at once, remembers the
        input for the response that chains to it, and the line says it was a local prewarm."""
        facts["prewarm"] = True
        response_id = "resp_" + uuid.uuid4().hex
        response: dict[str, Any] = {"id": response_id, "object": "response", "created_at": int(time.time()), "status": "completed",
                    "model": body.get("model"), "output": [], "usage": None}
        self.conversation.remember(response_id, body.get("input"), response)
        record = (SocketCall(self.ctx, self.route.rollout_id, self.request, body, facts)
                  if self.ctx.journal is not None and self.route.rollout_id else None)
        messages = [orjson.dumps({"type": kind, "sequence_number": number,
                                  "response": {**response, "status": status}})
                    for number, (kind, status) in enumerate((("response.created", "in_progress"),
                                                             ("response.completed", "completed")))]
        if record is not None:
            exchange = record.exchange
            exchange.response_source, exchange.local_response_reason = "local", "prewarm"
            exchange.local_body, exchange.upstream_attempted, exchange.upstream_status_code = response, False, None
            await record.finish()  # Durable before the client sees the end, as any response.
        for message in messages:
            self.socket.write(websocket.encode_frame(websocket.TEXT, message))

    def _send_error(self, status: int, kind: str, message: str) -> None:
        self.socket.write(websocket.encode_frame(websocket.TEXT, error_event(status, {"type": kind, "message": message})))

    def _close(self, code: int, reason: str) -> None:
        self.socket.write(websocket.encode_frame(websocket.CLOSE, websocket.close_payload(code, reason)))


__all__ = ["Bridge", "EventFrames", "switching_protocols_head"]
