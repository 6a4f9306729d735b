"""A TCP relay on loopback that keeps every byte each side sent, per connection, and reads the
replies out of them: what a harness received, and what the stand-in sent, compared as bytes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Optional

import httptools

from proxy.http import websocket


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class Connection:
    to_server: bytearray = field(default_factory=bytearray)
    to_client: bytearray = field(default_factory=bytearray)


class RecordingRelay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.connections: list[Connection] = []
        self._server: Optional[asyncio.base_events.Server] = None
        self.port = 0

    async def start(self) -> "RecordingRelay":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        record = Connection()
        self.connections.append(record)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, kept: bytearray) -> None:
            try:
                while data := await source.read(65536):
                    kept += data
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                if not sink.is_closing():
                    sink.close()

        await asyncio.gather(pipe(reader, up_writer, record.to_server), pipe(up_reader, writer, record.to_client))

    def replies(self) -> list[Reply]:
        """Every HTTP reply on every connection, bodies as sent (de-chunked, never decoded)."""
        return [reply for connection in self.connections for reply in read_replies(bytes(connection.to_client))[0]]

    def socket_messages(self) -> list[bytes]:
        """The text messages of every WebSocket a server sent on these connections."""
        messages = []
        for connection in self.connections:
            replies, after_upgrade = read_replies(bytes(connection.to_client))
            if replies and replies[-1].status == 101:
                reader = websocket.FrameReader(masked=False, deflate=websocket.agreed_deflate(
                    replies[-1].headers.get("sec-websocket-extensions", "").encode() or None, from_server=True))
                messages += [m.payload for m in reader.feed(after_upgrade) if m.opcode == websocket.TEXT]
        return messages


def read_replies(data: bytes) -> tuple[list[Reply], bytes]:
    """The replies in one connection's server bytes, and what follows a 101 (another protocol's)."""
    replies: list[Reply] = []

    class Callbacks:
        def __init__(self) -> None:
            self.headers: dict[str, str] = {}
            self.body = bytearray()

        def on_message_begin(self) -> None:
            self.headers, self.body = {}, bytearray()

        def on_header(self, name: bytes, value: bytes) -> None:
            self.headers[name.decode().lower()] = value.decode("latin-1")

        def on_body(self, body: bytes) -> None:
            self.body += body

        def on_message_complete(self) -> None:
            replies.append(Reply(parser.get_status_code(), self.headers, bytes(self.body)))

    callbacks = Callbacks()
    parser = httptools.HttpResponseParser(callbacks)
    try:
        parser.feed_data(data)
    except httptools.HttpParserUpgrade as upgrade:
        return replies, data[upgrade.args[0]:]
    except httptools.HttpParserError:
        pass
    return replies, b""


def sse_data(body: bytes) -> list[bytes]:
    """The data of each event of an SSE body (one per line of ``data:``; the stand-in's shape)."""
    return [line[len(b"data: "):] for line in body.replace(b"\r\n", b"\n").split(b"\n") if line.startswith(b"data: ")]
