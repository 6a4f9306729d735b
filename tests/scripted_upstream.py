"""A scripted HTTP/1.1 upstream on loopback that sends exactly the bytes a test wrote.

Written on raw asyncio streams, not a web framework, so nothing is added to the reply: no Date,
no Server, no re-chunking. A `Script` says what to send for a path -- the head, the body pieces,
pauses between them -- and how to end: close, keep the connection, reset it, hang, or answer with
bytes that are not HTTP at all. Every request received is recorded for the test to inspect.
"""

from __future__ import annotations

import asyncio
import gzip
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Script:
    """What the upstream answers on one path."""

    status: int = 200
    reason: str = "OK"
    headers: list[tuple[str, str]] = field(default_factory=list)
    pieces: list[bytes] = field(default_factory=list)
    #: Frame the body with chunked transfer coding instead of Content-Length.
    chunked: bool = False
    #: Seconds to wait before each body piece (0 still yields to the event loop and drains).
    pause: float = 0.0
    #: Seconds to wait before the piece at each of these positions instead (`pause` elsewhere).
    pauses: dict[int, float] = field(default_factory=dict)
    #: Seconds to wait before sending anything at all (read-timeout tests).
    delay_head: float = 0.0
    #: After the last piece: "finish" (end the reply properly), "reset" (abort the TCP
    #: connection without ending the body), "hang" (say nothing more for `hang_for` seconds, then
    #: finish), "close" (close the connection: ends a body that has no length and no chunking).
    ending: str = "finish"
    hang_for: float = 0.0
    #: Send these bytes instead of an HTTP reply.
    garbage: bytes | None = None

    def reply_bytes(self) -> bytes:
        """What a client reading this reply directly gets as its body."""
        return b"".join(self.pieces)


@dataclass
class ReceivedRequest:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None


def sse_script(body: bytes, pieces: list[bytes] | None = None, **kwargs: object) -> Script:
    """An SSE reply; `pieces` defaults to the whole body in one write."""
    headers = [("Content-Type", "text/event-stream"), ("Cache-Control", "no-cache"), ("X-Upstream", "scripted")]
    return Script(headers=headers, pieces=pieces or [body], chunked=True, **kwargs)  # type: ignore[arg-type]


def json_script(body: bytes, status: int = 200, reason: str = "OK", **kwargs: object) -> Script:
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body))), ("X-Request-Id", "req-1")]
    return Script(status=status, reason=reason, headers=headers, pieces=[body], **kwargs)  # type: ignore[arg-type]


def gzip_json_script(body: bytes) -> Script:
    packed = gzip.compress(body, mtime=0)
    headers = [("Content-Type", "application/json"), ("Content-Encoding", "gzip"), ("Content-Length", str(len(packed)))]
    return Script(headers=headers, pieces=[packed[:10], packed[10:]])


def split_every(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


class ScriptedUpstream:
    """Start with `start`; `scripts[path]` answers requests for that path (without query)."""

    def __init__(self) -> None:
        self.scripts: dict[str, Script] = {}
        #: Answers by the request itself (its body), before `scripts` is consulted; None: not this one.
        self.responder: Callable[[ReceivedRequest], Script | None] | None = None
        self.received: list[ReceivedRequest] = []
        #: Paths whose reply could not be written to the end because the peer went away.
        self.peer_gone: list[str] = []
        #: Body bytes written so far, per path (backpressure tests compare it with what was offered).
        self.bytes_sent: dict[str, int] = {}
        #: TCP connections accepted so far.
        self.connections = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.url = ""

    async def start(self) -> "ScriptedUpstream":
        self._server = await asyncio.start_server(self._serve_connection, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.sleep(0)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        self.connections += 1
        try:
            while await self._serve_one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        request = await _read_request(reader)
        if request is None:
            return False
        path = request.target.partition("?")[0]
        if not ((request.method, path) in _START_PROBES and path not in self.scripts):
            # The token capture mode's probes at start (docs/tokens.md: the engine, "SGLang"; the
            # renderer, "Prefix supply") are answered 404, as an upstream without them does, and
            # not kept among the calls a test inspects.
            self.received.append(request)
        script = self.responder(request) if self.responder is not None else None
        if script is None:
            script = self.scripts.get(path, Script(status=404, reason="Not Found", headers=[("Content-Length", "0")]))
        try:
            return await self._send(script, reader, writer, path, head_only=request.method == "HEAD")
        except ConnectionError:
            self.peer_gone.append(path)
            return False

    async def _send(self, script: Script, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str,
                    head_only: bool = False) -> bool:
        if script.delay_head:
            await asyncio.sleep(script.delay_head)
        if script.garbage is not None:
            writer.write(script.garbage)
            await writer.drain()
            return False
        head = [f"HTTP/1.1 {script.status} {script.reason}"]
        head += [f"{name}: {value}" for name, value in script.headers]
        if script.chunked:
            head.append("Transfer-Encoding: chunked")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        if head_only:  # A reply to HEAD has no body, whatever its headers say.
            return True
        for position, piece in enumerate(script.pieces):
            await asyncio.sleep(script.pauses.get(position, script.pause))
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece) if script.chunked else piece)
            await writer.drain()
            self.bytes_sent[path] = self.bytes_sent.get(path, 0) + len(piece)
            if writer.transport.is_closing():
                raise ConnectionResetError
        if script.ending == "reset":
            writer.transport.abort()
            return False
        if script.ending == "close":
            return False
        if script.ending == "hang":
            await _watch_for_close(reader, writer, script.hang_for)
        if script.chunked:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        return True


async def _watch_for_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seconds: float) -> None:
    """Wait ``seconds``; raise ConnectionResetError as soon as the peer closes its side."""
    try:
        data = await asyncio.wait_for(reader.read(1), seconds)
    except asyncio.TimeoutError:
        return
    if not data or writer.transport.is_closing():
        raise ConnectionResetError


#: The token capture mode's probes at start: ``GET /server_info`` and ``POST /tokenize``.
_START_PROBES = {("GET", "/server_info"), ("POST", "/tokenize")}


async def _read_request(reader: asyncio.StreamReader) -> ReceivedRequest | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:] if line]
    request = ReceivedRequest(method, target, headers, b"")  # type: ignore[arg-type]
    if (request.header("Transfer-Encoding") or "").lower() == "chunked":
        request.body = await _read_chunked(reader)
    elif request.header("Content-Length"):
        request.body = await reader.readexactly(int(request.header("Content-Length") or 0))
    return request


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return body
        body += await reader.readexactly(size)
        await reader.readexactly(2)
