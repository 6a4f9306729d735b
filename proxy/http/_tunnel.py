"""A connection after its upgrade (RFC 9110 §7.8): bytes both ways, no HTTP framing any more.

Both ends look alike to whoever relays them: `read` (b"" at the end), `write`, `drain` (wait while
the peer is not reading), `close`. `ServerTunnel` is a client connection taken over by its handler
(`Http1Connection.take_over`); `StreamTunnel` is an upstream connection opened for an upgrade
(`UpstreamPool.upgrade`).
"""

from __future__ import annotations

import asyncio
from typing import Callable, Optional

#: Bytes read from a client and not yet taken before reading pauses (the relay takes them as fast
#: as the upstream does).
_READ_HIGH_WATER = 1024 * 1024


class ServerTunnel:
    """The client's side: fed by the connection's ``data_received``, written to its transport."""

    def __init__(self, transport: asyncio.Transport, already: bytes) -> None:
        self._transport = transport
        self._chunks: list[bytes] = [already] if already else []
        self._buffered = len(already)
        self._ended = False
        self._waiter: Optional[asyncio.Future[None]] = None
        self._writable: Optional[asyncio.Future[None]] = None
        self._paused = False
        #: Told True / False as writing to the client pauses / resumes (a bridged call's pump).
        self.on_flow: Optional[Callable[[bool], None]] = None
        self.write_paused = False
        #: Told once when the sidecar drains (SIGTERM): the protocol's own goodbye is the handler's.
        self.on_shutdown: Optional[Callable[[], None]] = None
        self.shutting_down = False

    # -- fed by the connection -------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _READ_HIGH_WATER and not self._paused:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def feed_eof(self) -> None:
        self._ended = True
        self._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def shut_down(self) -> None:
        if not self.shutting_down:
            self.shutting_down = True
            if self.on_shutdown is not None:
                self.on_shutdown()

    def writing_paused(self, paused: bool) -> None:
        self.write_paused = paused
        if self.on_flow is not None:
            self.on_flow(paused)
        if not paused and self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        if paused and (self._writable is None or self._writable.done()):
            self._writable = asyncio.get_running_loop().create_future()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- used by the relay -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """The client's connection is gone (or closing): nothing written reaches it."""
        return self._ended or self._transport.is_closing()

    async def read(self) -> bytes:
        while not self._chunks:
            if self._ended:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        data = b"".join(self._chunks)
        self._chunks, self._buffered = [], 0
        if self._paused:
            self._paused = False
            self._transport.resume_reading()
        return data

    def write(self, data: bytes) -> None:
        if data and not self._transport.is_closing():
            self._transport.write(data)

    async def drain(self) -> None:
        if self._writable is not None and not self._writable.done():
            await self._writable

    def close(self) -> None:
        if not self._transport.is_closing():
            self._transport.close()


class StreamTunnel:
    """The upstream's side: an asyncio stream pair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self) -> bytes:
        try:
            return await self._reader.read(256 * 1024)
        except (ConnectionError, OSError):
            return b""

    def write(self, data: bytes) -> None:
        if data and not self._writer.is_closing():
            self._writer.write(data)

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except (ConnectionError, OSError):
            pass

    def close(self) -> None:
        if not self._writer.is_closing():
            self._writer.close()


__all__ = ["ServerTunnel", "StreamTunnel"]
