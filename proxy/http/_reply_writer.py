"""The reply writer of a server connection: one reply's status line, head and body framing (RFC 9112).

Composed, not inherited: the connection (`Http1Connection`: the socket, the parser and the
pipeline) makes one writer per reply and hands it to the handler, as uvicorn hands its app a
request-response cycle object apart from its protocol. It frames exactly what it is given: the head as queued, the body chunked or not, no body
for HEAD, 1xx, 204 and 304 (RFC 9112 §6.3), HTTP/1.0 clients answered without chunks and closed.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Callable, Optional, Protocol

from ._headers import Headers
from ._tunnel import ServerTunnel


class Answered(Protocol):
    """What the writer needs of the request it answers."""

    method: str
    http10: bool


class ClientConnection(Protocol):
    """What a reply's writer, and the handler through it, may use of its client connection."""

    transport: Optional[asyncio.Transport]
    #: The client has gone: nothing more is written.
    gone: bool
    #: The connection ends after this reply (the reply's head says so).
    closing: bool
    #: Called with True / False when writing pauses / resumes (the call's body pump).
    on_write_flow: Optional[Callable[[bool], None]]

    @property
    def writing_paused(self) -> bool: ...

    def abort(self) -> None: ...

    def take_over(self) -> ServerTunnel: ...


class ReplyWriter:
    """Writes one reply to its connection's transport: `start`, `write` (or `flush_head`), `end`;
    `cork` / `uncork` around writes that go out as one; `reply` for a whole small one.
    ``connection``: the client connection, for what is not this reply's (its flow, an abort, a
    take-over)."""

    __slots__ = ("connection", "transport", "answering", "_no_body", "_chunked", "_head", "_corked",
                 "response_started", "response_ended", "first_body_at")

    def __init__(self, connection: ClientConnection, answering: Optional[Answered]) -> None:
        self.connection = connection
        self.transport = connection.transport
        #: The request this reply answers (None: a refusal outside any request's turn).
        self.answering = answering
        #: The reply has no body (HEAD, 1xx, 204, 304).
        self._no_body = False
        self._chunked = False
        #: A reply head not sent yet (see `start`).
        self._head = b""
        #: Writes held by `cork` until `uncork`.
        self._corked: Optional[list[bytes]] = None
        self.response_started = False
        self.response_ended = False
        #: When the first body bytes were sent (`perf_counter`; 0.0: none yet): a call's ``first_byte``.
        self.first_body_at = 0.0

    @property
    def gone(self) -> bool:
        """The client has gone: nothing more is written."""
        return self.connection.gone

    def start(self, status: int, reason: bytes, headers: Headers, chunked: bool) -> None:
        """Queue the status line and ``headers`` exactly as given (``chunked`` adds the framing
        header). The head goes out with the first body bytes, the end, or `flush_head`: one
        socket write instead of two for a reply whose body is already here."""
        head = [b"HTTP/1.1 %d %s\r\n" % (status, reason)]
        for name, value in headers:
            head.append(b"%s: %s\r\n" % (name, value))
        # RFC 9112 §6.3: these replies end with their head. A HEAD reply keeps the framing header
        # the upstream gave it (it says what GET would send) but never a body or a last chunk.
        answering = self.answering
        if status < 200 or status == 204 or status == 304:
            self._no_body, chunked = True, False
        else:
            self._no_body = answering is not None and answering.method == "HEAD"
        if chunked and answering is not None and answering.http10:
            chunked = False  # HTTP/1.0 has no chunked coding: the body ends when we close.
            self.connection.closing = True
        if chunked:
            head.append(b"Transfer-Encoding: chunked\r\n")
        if self.connection.closing:
            head.append(b"Connection: close\r\n")
        head.append(b"\r\n")
        self._chunked = chunked and not self._no_body
        self.response_started = True
        self._head = b"".join(head)

    def flush_head(self) -> None:
        """Send a queued head now (a stream whose first event is not here yet)."""
        if self._head:
            head, self._head = self._head, b""
            if self.transport is not None and not self.connection.gone:
                self._send(head)

    def write(self, data: bytes) -> None:
        """Send body bytes (framed as one chunk when the reply is chunked). Never blocks."""
        if not data or self.connection.gone or self.transport is None:
            return
        if self._no_body:  # Bytes after a bodiless reply's head would be read as the next reply.
            self.flush_head()
            return
        head, self._head = self._head, b""
        if not self.first_body_at:
            self.first_body_at = perf_counter()
        # One `write` of one joined buffer: uvloop's `writelines` costs more than the copy of a
        # model reply's chunk (profiled: half the pump's time on 256-event streams).
        if self._chunked:
            self._send(b"%s%x\r\n%s\r\n" % (head, len(data), data))
        elif head:
            self._send(head + data)
        else:
            self._send(data)

    def end(self, last: bytes = b"") -> None:
        """End the reply; ``last``: its last body bytes, sent with the end in one write."""
        head, self._head = self._head, b""
        if not self.connection.gone and self.transport is not None:
            if self._no_body or not last:
                ending = head + b"0\r\n\r\n" if self._chunked else head
            elif self._chunked:
                ending = b"%s%x\r\n%s\r\n0\r\n\r\n" % (head, len(last), last)
            else:
                ending = head + last
            if ending:
                self._send(ending)
        self.response_ended = True

    def cork(self) -> None:
        """Hold the writes until `uncork`, which sends them in one socket write: what a reply
        releases at once (a held terminal event, the cut's tail, the last chunk) costs one
        syscall and wakes the client once (each send on loopback costs 20-90 µs here; issue 34)."""
        if self._corked is None:
            self._corked = []

    def uncork(self) -> None:
        corked, self._corked = self._corked, None
        if corked and self.transport is not None and not self.connection.gone:
            self.transport.write(b"".join(corked))  # One piece: joined without a copy.

    def _send(self, data: bytes) -> None:
        if self._corked is not None:
            self._corked.append(data)
        else:
            self.transport.write(data)  # type: ignore[union-attr]  # set in connection_made, before any write

    def reply(self, status: int, reason: bytes, headers: Headers, body: bytes) -> None:
        """A whole reply with a Content-Length (local replies, the admin endpoints)."""
        self.start(status, reason, [*headers, (b"Content-Length", str(len(body)).encode())], chunked=False)
        self.write(body)
        self.end()
