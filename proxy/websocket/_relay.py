"""The relay (docs/wire.md): a Responses WebSocket to an upstream that accepts the upgrade, its bytes
forwarded both ways unchanged, each response captured as one call line.

Both directions are read as copies (`FrameReader`, with permessage-deflate inflated when the two
ends agreed it): the client's ``response.create`` messages open responses, the server's messages
feed the oldest open one. The frame that completes a response's ending event is held back, from
its first byte, until the line is durable: when the agent has the end of a response, its record
is on disk. A copy that cannot be read (a protocol error, a message over the bound) stops the
capture of the socket, said once, never the relaying.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from typing import Any, Optional

from ..call import CallContext
from ..http import ServerRequest, ServerTunnel, StreamTunnel, websocket
from ._conversation import Conversation
from ._metrics import WebSocketMetrics
from ._events import CREATE, create_body, parsed_message
from ._socket_call import SocketCall

log = logging.getLogger("mcc.websocket")


class Relay:
    """One client socket and its upstream socket; `run` until either closes."""

    def __init__(self, ctx: CallContext, request: ServerRequest, rollout_id: Optional[str], client: ServerTunnel,
                 upstream: StreamTunnel, extensions: Optional[bytes]) -> None:
        self.ctx = ctx
        self.request = request
        self.rollout_id = rollout_id
        self.client = client
        self.upstream = upstream
        self.socket_id = uuid.uuid4().hex[:16]
        self.conversation = Conversation()
        self.turns = 0
        self.open: deque[SocketCall] = deque()
        self.capturing = ctx.journal is not None and rollout_id is not None
        self._from_client = websocket.FrameReader(True, ctx.max_body_bytes,
                                                  websocket.agreed_deflate(extensions, from_server=False))
        self._from_server = websocket.FrameReader(False, ctx.max_body_bytes,
                                                  websocket.agreed_deflate(extensions, from_server=True))
        self._client_closed = False
        client.on_shutdown = self._shut_down

    def _shut_down(self) -> None:
        """The sidecar drains: once no response is open and no server message is part-way, the
        client is told 1001 (going away) and both sockets close; the client reconnects elsewhere."""
        if not self.capturing:  # Its frames are not read: where a message ends is not known.
            self.client.feed_eof()
            self.upstream.close()
        elif not self.open and self._from_server.between_messages:
            self.client.write(websocket.encode_frame(websocket.CLOSE, websocket.close_payload(
                websocket.GOING_AWAY, "the sidecar is shutting down")))
            self.client.feed_eof()
            self.upstream.close()

    async def run(self) -> None:
        upward = asyncio.ensure_future(self._client_to_upstream())
        downward = asyncio.ensure_future(self._upstream_to_client())
        try:
            await asyncio.wait((upward, downward), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (upward, downward):
                task.cancel()
            await asyncio.gather(upward, downward, return_exceptions=True)
            self.client.close()
            self.upstream.close()
            await self._cut_open_responses()

    async def _client_to_upstream(self) -> None:
        while True:
            data = await self.client.read()
            if not data:
                self._client_closed = True
                return
            self.upstream.write(data)  # As it came, before it is read.
            for message in self._read(self._from_client, data):
                if message.opcode == websocket.TEXT:
                    self._client_message(message.payload)
                elif message.opcode == websocket.CLOSE:
                    self._client_closed = True
            await self.upstream.drain()

    async def _upstream_to_client(self) -> None:
        base = 0  # Where ``data`` begins in the server's stream.
        while True:
            data = await self.upstream.read()
            if not data:
                return
            sent = 0
            for message in self._read(self._from_server, data):
                if message.opcode != websocket.TEXT or not self.open:
                    continue
                call = self.open[0]
                if call.feed(message.payload, parsed_message(message.payload)):
                    self.open.popleft()
                    hold_from = max(sent, message.last_frame_at - base)
                    self.client.write(data[sent:hold_from])  # Everything before the ending frame.
                    sent = hold_from
                    self.conversation.remember((call.response or {}).get("id"), call.request.get("input"), call.response)
                    await call.finish()  # Durable, then the ending frame goes.
            self.client.write(data[sent:])
            base += len(data)
            await self.client.drain()
            if self.client.shutting_down:
                self._shut_down()

    def _read(self, reader: websocket.FrameReader, data: bytes) -> list[websocket.Message]:
        if not self.capturing:
            return []
        try:
            return reader.feed(data)
        except websocket.WebSocketError as error:
            self.capturing = False  # Relaying goes on; the capture of this socket stops.
            self.ctx.metrics.feature(WebSocketMetrics).websocket_capture_stopped.inc()
            self.ctx.warnings.warning(("websocket", "unreadable"), "stopped capturing a relayed WebSocket of rollout %s: "
                                      "its frames cannot be read (%s); the bytes are still relayed unchanged",
                                      self.rollout_id, error.reason)
            for call in self.open:
                call.cut_short(by_client=False)
            return []

    def _client_message(self, payload: bytes) -> None:
        event = parsed_message(payload)
        if event is None or event.get("type") != CREATE or self.rollout_id is None:
            return
        turn, self.turns = self.turns, self.turns + 1
        body, chained = self.conversation.whole_request(create_body(event))
        body.pop("stream", None)  # Over a relayed socket the client sent none: recorded as it asked.
        facts: dict[str, Any] = {"mode": "relay", "socket": self.socket_id, "turn": turn}
        if chained is not None:
            facts["previous_response_id"] = chained
        if event.get("generate") is False:
            facts["prewarm"] = True
        self.open.append(SocketCall(self.ctx, self.rollout_id, self.request, body, facts))

    async def _cut_open_responses(self) -> None:
        """Responses still open when the socket closed: each line says who closed it."""
        while self.open:
            call = self.open.popleft()
            if not call.ended:
                call.cut_short(by_client=self._client_closed)
            await call.finish()



__all__ = ["Relay"]
