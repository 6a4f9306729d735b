"""The Responses WebSocket mode on loopback, for the tests: an upstream that accepts it, and a raw
client that records every byte it receives.

`WebSocketUpstream` is aiohttp's WebSocket server (permessage-deflate when the client offers it, as
aiohttp agrees by default) answering each ``response.create`` with the events a streamed
``POST /v1/responses`` to the stand-in answers the same request, one text frame per SSE event, so
a response over the socket can be compared with the same response over HTTP. ``generate: false``
gets ``response.created`` and ``response.completed`` with no output.

`RawSocket` speaks the handshake and frames by hand (a fixed key and mask), so two sessions that
send the same bytes can be compared byte for byte: direct, and through the sidecar.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Optional

import aiohttp
import orjson
from aiohttp import web

from proxy.http import websocket


class WebSocketUpstream:
    def __init__(self, stand_in_url: str, pace: float = 0.0) -> None:
        self.stand_in_url = stand_in_url
        #: Seconds between the events of a response (the stand-in's ``X-Stand-In-Pace``).
        self.pace = pace
        self.creates: list[dict[str, Any]] = []
        self._runner: Optional[web.AppRunner] = None
        self.url = ""

    async def start(self) -> "WebSocketUpstream":
        app = web.Application()
        app.router.add_get("/v1/responses", self._socket)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(autoping=True)
        await socket.prepare(request)
        warm: dict[str, list[Any]] = {}  # A prewarm's input, by its id: this socket's state.
        async with aiohttp.ClientSession() as http:
            async for message in socket:
                if message.type != aiohttp.WSMsgType.TEXT:
                    continue
                event = orjson.loads(message.data)
                self.creates.append(event)
                body = {key: value for key, value in event.items() if key not in ("type", "generate")}
                if event.get("generate") is False:
                    response = {"id": f"resp_warm_{len(self.creates)}", "object": "response", "status": "completed",
                                "model": body.get("model"), "output": []}
                    warm[response["id"]] = _items(body.get("input"))
                    await socket.send_str(orjson.dumps({"type": "response.created", "response": response}).decode())
                    await socket.send_str(orjson.dumps({"type": "response.completed", "response": response}).decode())
                    continue
                if body.get("previous_response_id") in warm:  # The socket's own warm context, not the stand-in's.
                    body["input"] = [*warm[body.pop("previous_response_id")], *_items(body.get("input"))]
                async with http.post(self.stand_in_url + "/v1/responses", data=orjson.dumps({**body, "stream": True}),
                                     headers={"Content-Type": "application/json",
                                              "X-Stand-In-Pace": str(self.pace)}) as reply:
                    async for line in reply.content:  # Each event's frame as its event comes.
                        if line.startswith(b"data: "):
                            await socket.send_str(line[len(b"data: "):].rstrip(b"\r\n").decode())
        return socket


def _items(given: Any) -> list[Any]:
    """A Responses ``input`` as a list of items."""
    return [{"role": "user", "content": given}] if isinstance(given, str) else list(given or [])


async def sse_data(http: aiohttp.ClientSession, url: str, body: dict[str, Any], path: str = "/v1/responses") -> list[bytes]:
    """The data of each event of a streamed POST (what one text frame per event carries)."""
    async with http.post(url + path, data=orjson.dumps({**body, "stream": True}),
                         headers={"Content-Type": "application/json"}) as reply:
        raw = await reply.read()
    return [block[len(b"data: "):] for block in raw.replace(b"\r\n", b"\n").split(b"\n\n")
            for block in [next((line for line in block.split(b"\n") if line.startswith(b"data: ")), b"")] if block]


class RawSocket:
    """A client socket written by hand: every byte after the handshake's head is kept."""

    KEY = base64.b64encode(b"0123456789abcdef")
    MASK = b"\x01\x02\x03\x04"

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
        self.reader, self.writer, self.head = reader, writer, head
        self.received = bytearray()
        self._frames = websocket.FrameReader(masked=False, deflate=websocket.agreed_deflate(
            _header(head, b"sec-websocket-extensions"), from_server=True))
        self._pending: list[websocket.Message] = []

    @classmethod
    async def connect(cls, url: str, path: str, deflate: bool = False,
                      headers: tuple[tuple[str, str], ...] = ()) -> "RawSocket":
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {cls.KEY.decode()}", "Sec-WebSocket-Version: 13",
                 *(["Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits"] if deflate else []),
                 *(f"{name}: {value}" for name, value in headers)]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = await reader.readuntil(b"\r\n\r\n")
        return cls(reader, writer, head)

    @property
    def status(self) -> int:
        return int(self.head.split(b" ", 2)[1])

    def send_text(self, payload: bytes, fragments: int = 1) -> None:
        self.writer.write(self.frames_of(payload, fragments))

    def frames_of(self, payload: bytes, fragments: int = 1) -> bytes:
        size = max(1, -(-len(payload) // fragments))
        pieces = [payload[at:at + size] for at in range(0, len(payload), size)] or [b""]
        return b"".join(websocket.encode_frame(websocket.TEXT if index == 0 else websocket.CONTINUATION, piece,
                                               mask=self.MASK, fin=index == len(pieces) - 1)
                        for index, piece in enumerate(pieces))

    def send(self, opcode: int, payload: bytes = b"") -> None:
        self.writer.write(websocket.encode_frame(opcode, payload, mask=self.MASK))

    async def next_message(self, timeout: float = 10.0) -> websocket.Message:
        while not self._pending:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise EOFError("the socket closed")
            self.received += data
            self._pending.extend(self._frames.feed(data))
        return self._pending.pop(0)

    async def until_ending(self) -> list[dict[str, Any]]:
        """The events of one response, up to its ending event."""
        events = []
        while True:
            message = await self.next_message()
            if message.opcode != websocket.TEXT:
                continue
            events.append(orjson.loads(message.payload))
            if events[-1]["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
                return events

    def close(self) -> None:
        self.writer.close()


def _header(head: bytes, name: bytes) -> Optional[bytes]:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def create(input_: Any, previous: Optional[str] = None, **more: Any) -> bytes:
    event: dict[str, Any] = {"type": "response.create", "model": "m", "input": input_, **more}
    if previous is not None:
        event["previous_response_id"] = previous
    return orjson.dumps(event)


__all__ = ["RawSocket", "WebSocketUpstream", "create", "sse_data"]
