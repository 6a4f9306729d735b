"""The reply writer of a server connection: one reply's status line, head and body framing (RFC 9112).

Split out of the connection (`Http1Connection` is the socket, the parser and the pipeline; this is
what a handler writes through), as uvicorn keeps its request-response cycle apart from its
protocol. It frames exactly what it is given: the head as queued, the body chunked or not, no body
for HEAD, 1xx, 204 and 304 (RFC 9112 §6.3), HTTP/1.0 clients answered without chunks and closed.
"""

from __future__ import annotations

import asyncio
from typing import Optional, Protocol

from ._headers import Headers


class Answered(Protocol):
    """What the writer needs of the request it answers."""

    method: str
    http10: bool


class ReplyWriter:
    """Writes one reply at a time to the connection's transport: `start`, `write` (or `flush_head`),
    `end`; `cork` / `uncork` around writes that go out as one; `reply` for a whole small one.

    The connection it is part of provides ``transport`` and ``gone``, sets ``answering`` before
    each reply, and shares ``_closing``: a reply that must end the connection says so in its head.
    """

    transport: Optional[asyncio.Transport]
    gone: bool
    _closing: bool

    # The state of the reply being written; these class values are its state before the first
    # (each assignment makes the connection's own: no __init__ to chain).
    #: The request the next reply answers (None: a refusal outside any request's turn).
    answering: Optional[Answered] = None
    #: The reply now being written has no body (HEAD, 1xx, 204, 304).
    _no_body = False
    _chunked = False
    #: A reply head not sent yet (see `start`).
    _head = b""
    #: Writes held by `cork` until `uncork`.
    _corked: Optional[list[bytes]] = None
    response_started = False
    response_ended = False

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
            self._closing = True
        if chunked:
            head.append(b"Transfer-Encoding: chunked\r\n")
        if self._closing:
            head.append(b"Connection: close\r\n")
        head.append(b"\r\n")
        self._chunked = chunked and not self._no_body
        self.response_started = True
        self._head = b"".join(head)

    def flush_head(self) -> None:
        """Send a queued head now (a stream whose first event is not here yet)."""
        if self._head:
            head, self._head = self._head, b""
            if self.transport is not None and not self.gone:
                self._send(head)

    def write(self, data: bytes) -> None:
        """Send body bytes (framed as one chunk when the reply is chunked). Never blocks."""
        if not data or self.gone or self.transport is None:
            return
        if self._no_body:  # Bytes after a bodiless reply's head would be read as the next reply.
            self.flush_head()
            return
        head, self._head = self._head, b""
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
        if not self.gone and self.transport is not None:
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
        if corked and self.transport is not None and not self.gone:
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
