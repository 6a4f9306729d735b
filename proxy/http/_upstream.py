"""Upstream connections: a keep-alive pool of raw HTTP/1.1 connections to the model server (issue 5).

One ``asyncio.Protocol`` per connection, parsing replies with httptools. The head of a reply is
awaited; its body is pushed, one socket read's chunks at a time, into a `BodySink` (the forwarder's
pump) from the protocol's own callback -- no task switch per read. ``pause`` / ``resume``
stop reading the socket, so a slow client slows the model server instead of filling memory.

Failures are typed for the forwarder: `UpstreamConnectError` (no connection: 502),
`UpstreamTimeout` (no head within the read timeout: 504), `UpstreamProtocolError` (reset or
garbage before the head: 502); after the head, `BodySink.on_error` says ``reset`` or ``timeout``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from typing import NamedTuple, Optional, Protocol
from urllib.parse import urlsplit
from time import perf_counter

import httptools

from ._headers import Headers, first_values
from ._tunnel import StreamTunnel

#: An idle connection older than this is closed rather than reused: servers close idle
#: keep-alive connections (uvicorn, vLLM's server, after 5 s), and reusing one they are closing
#: races with their FIN. The default of ``--upstream-idle-timeout``.
IDLE_REUSE_SECONDS = 4.0
#: A connection idle for less than this is reused without peeking at its socket: no upstream closes
#: keep-alive connections that fast, and the peek (a syscall) would cost every call under load.
PEEK_AFTER_IDLE_SECONDS = 0.25
#: Methods a request may be sent again with after a reused connection failed before any reply
#: (RFC 9110 §9.2.2). A POST that may have reached the upstream is never sent twice: the model
#: would generate twice (nginx's ``proxy_next_upstream`` refuses non-idempotent methods too).
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
#: Idle connections kept per pool.
MAX_IDLE = 1024


class UpstreamConnectError(Exception):
    """No connection to the upstream (refused, unreachable, DNS, connect timeout)."""


class UpstreamTimeout(Exception):
    """The upstream accepted the request but sent no reply head within the read timeout."""


class UpstreamProtocolError(Exception):
    """The upstream closed, reset or sent something that is not HTTP before its reply head."""


class BodySink(Protocol):
    """Where a reply's body goes (the forwarder's pump).

    ``on_read`` gets the chunks of the upstream's framing that one socket read brought (never
    none; the list is the sink's): a sink handles them together (one tap feed, one client
    write), since they arrived together anyway.
    """

    def on_read(self, chunks: list[bytes]) -> None: ...
    def on_end(self) -> None: ...
    def on_error(self, kind: str, exc: BaseException) -> None: ...


class UpstreamReply:
    """The head of one upstream reply; `attach` a sink to receive its body."""

    def __init__(self, connection: "UpstreamConnection", status: int, reason: bytes, headers: Headers,
                 chunked: bool, content_length: Optional[int], fields: Optional[dict[bytes, bytes]] = None) -> None:
        self._connection = connection
        self.status = status
        self.reason = reason
        self.headers = headers
        #: The first value of each field by its lower-case name (a lookup, not a scan of ``headers``).
        self.fields = fields if fields is not None else first_values(headers)
        #: The upstream framed the body with chunked transfer coding (or until close, no length).
        self.chunked = chunked
        self.content_length = content_length
        #: Seconds the pool took to give this request a connection (one reused, or one made).
        self.connect_seconds = 0.0

    def header(self, name: bytes) -> Optional[bytes]:
        """The first value of the field ``name`` (lower case), else None."""
        return self.fields.get(name)

    def attach(self, sink: BodySink) -> None:
        self._connection.attach(sink)

    def pause(self) -> None:
        self._connection.pause()

    def resume(self) -> None:
        self._connection.resume()

    def close(self) -> None:
        """Done with this reply: the connection goes back to the pool if the reply ended cleanly,
        else it is closed (closing mid-body is how the model server learns to stop generating)."""
        self._connection.release()


class UpstreamConnection(asyncio.Protocol):
    """One connection to the upstream, serving one request at a time."""

    def __init__(self, pool: "UpstreamPool") -> None:
        self._pool = pool
        #: The body chunks of the read being parsed (or, before a sink is attached, of the reads
        #: so far). httptools looks ``on_body`` up once, when the parser is made: the list's own
        #: C method takes each chunk, not a Python call per chunk (a vLLM stream's every token is
        #: a chunk of its own; issue 34). The list is never replaced, only emptied.
        self._chunks: list[bytes] = []
        self.on_body = self._chunks.append
        self._parser = httptools.HttpResponseParser(self)
        self.transport: Optional[asyncio.Transport] = None
        self._head: Optional[asyncio.Future[UpstreamReply]] = None
        self._sink: Optional[BodySink] = None
        self._reason = b""
        self._headers: Headers = []
        self._fields: dict[bytes, bytes] = {}
        self._complete = False
        self._keep_alive = False
        self._ended = False
        self._failed: Optional[tuple[str, BaseException]] = None
        self._head_only = False
        #: The final (not 1xx) reply's head is complete: header fields after it are trailers, and a
        #: message that ends before it was an interim reply, skipped.
        self._head_seen = False
        self.received = 0
        self.closed = False
        self.idle_since = 0.0
        self._last_read = 0.0
        self._timer: Optional[asyncio.TimerHandle] = None
        self._paused = False
        #: A duplicate of the socket, to peek at it before reuse (`quiet`); closed with the connection.
        self._probe: Optional[socket.socket] = None

    # -- sending -----------------------------------------------------------------------------

    def send(self, request: bytes, head_only: bool) -> "asyncio.Future[UpstreamReply]":
        loop = asyncio.get_running_loop()
        self._head = loop.create_future()
        self._sink, self._headers, self._fields, self._reason = None, [], {}, b""
        self._chunks.clear()
        self._complete = self._ended = self._keep_alive = self._head_seen = False
        self._failed = None
        self._head_only = head_only
        self.received = 0
        self._last_read = loop.time()
        if self._timer is None:
            self._arm_timer()
        assert self.transport is not None
        self.transport.write(request)
        return self._head

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # asyncio gives a transport of the kind its protocol asked for
        sock = transport.get_extra_info("socket")
        try:
            self._probe = socket.socket(fileno=os.dup(sock.fileno())) if sock is not None else None
        except OSError:
            self._probe = None

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        self._last_read = self._pool.loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail("reset", UpstreamProtocolError(f"the upstream sent a malformed reply: {exc}"))
            self._close()
        finally:
            self._deliver()  # The chunks of one read go on as one (see `BodySink.on_read`).

    def eof_received(self) -> Optional[bool]:
        return None  # Close; a body read until close ends in connection_lost.

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.closed = True
        self._close_probe()
        self._cancel_timer()
        self._pool.forget(self)
        if self._head is not None and not self._head.done():
            error = exc or ConnectionResetError("the upstream closed the connection before replying")
            self._head.set_exception(UpstreamProtocolError(f"{type(error).__name__}: {error}"))
            return
        if self._complete:
            return
        if self._head is not None and not self._framed():
            self._finish()  # A body delimited by the close of the connection.
            return
        self._fail("reset", exc or ConnectionResetError("the upstream closed the connection mid-reply"))

    # -- httptools callbacks -----------------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_seen:
            return  # A trailer field of a chunked body (llhttp reports them as headers): not forwarded, as nginx.
        self._headers.append((name, value))
        self._fields.setdefault(name.lower(), value)  # The first value, as `header_value` finds it.

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        self._head_seen = not 100 <= status < 200
        if 100 <= status < 200:
            # An interim reply (103 Early Hints, a 100 we never asked for): skipped, as nginx does.
            # The parser reports it as a whole message; the reply, its body and the connection's
            # return to the pool all wait for the final one (a 1xx taken for the end let the next
            # client on this connection read this one's body).
            self._headers, self._fields, self._reason = [], {}, b""
            return
        fields = self._fields
        length = fields.get(b"content-length")
        content_length = int(length) if length is not None and length.strip().isdigit() else None
        chunked = b"transfer-encoding" in fields
        if self._head_only or status in (204, 304):
            content_length = 0
        reply = UpstreamReply(self, status, self._reason, self._headers, chunked or content_length is None, content_length,
                              fields)
        if self._head is not None and not self._head.done():
            self._head.set_result(reply)
        if self._head_only:
            self._complete = True
            self._finish()
            self._close()  # The parser would wait for a body a HEAD reply never has.

    def on_message_complete(self) -> None:
        if not self._head_seen or self._complete:
            return  # The end of an interim (1xx) reply, or a HEAD reply already finished.
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()  # Asked now: the parser resets after this.
        self._finish()

    # -- the body ----------------------------------------------------------------------------

    def attach(self, sink: BodySink) -> None:
        self._sink = sink
        self._deliver()
        if self._ended:
            sink.on_end()
        elif self._failed is not None:
            sink.on_error(*self._failed)

    def _finish(self) -> None:
        if self._ended:
            return
        self._ended = True
        if self._sink is not None:
            self._deliver()
            self._sink.on_end()

    def _deliver(self) -> None:
        """The chunks gathered so far, to the sink (if one is attached yet)."""
        chunks = self._chunks
        if chunks and self._sink is not None:
            batch = chunks.copy()
            chunks.clear()
            self._sink.on_read(batch)

    def _fail(self, kind: str, exc: BaseException) -> None:
        if self._ended or self._failed is not None:
            return
        self._failed = (kind, exc)
        if self._head is not None and not self._head.done():
            self._head.set_exception(exc if isinstance(exc, (UpstreamProtocolError, UpstreamTimeout))
                                     else UpstreamProtocolError(str(exc)))
        elif self._sink is not None:
            self._deliver()
            self._sink.on_error(kind, exc)

    def _framed(self) -> bool:
        """True when the reply declared its end (a length or chunked coding), so a close cuts it short."""
        return b"content-length" in self._fields or b"transfer-encoding" in self._fields

    def pause(self) -> None:
        # A reply already complete has nothing more to read (a stream's terminal often comes in
        # the read that ends the body): no epoll change to pause, none to resume.
        if not self._paused and self.transport is not None and not self.closed and not self._complete:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self._last_read = self._pool.loop.time()  # Waiting on our client is not the upstream's silence.
            self.transport.resume_reading()

    def quiet(self) -> bool:
        """True when nothing is waiting to be read on the idle socket: no FIN, no stray bytes.

        One ``recv(MSG_PEEK | MSG_DONTWAIT)`` on a duplicate of the descriptor, made once per
        connection (the transport's own socket object may not offer ``recv``, under uvloop).
        """
        probe = self._probe
        if probe is None:
            return True
        try:
            probe.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True  # Nothing to read: open and quiet.
        except OSError:
            return False
        return False  # b"" (the upstream's FIN) or bytes nobody asked for: not reusable.

    def release(self) -> None:
        self._sink = None
        if self._ended and self._complete and self._keep_alive and not self.closed and not self._head_only:
            if self._paused:  # Reading again, to notice the upstream closing it while idle.
                self._paused = False
                self.transport.resume_reading()  # type: ignore[union-attr]  # set in connection_made, before any read
            self._pool.give_back(self)
        else:
            self._close()

    def _close_probe(self) -> None:
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    def _close(self) -> None:
        self._close_probe()
        self._cancel_timer()
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()
            self._pool.forget(self)

    # -- the read timeout: one timer per connection for its life, re-armed only when it fires --

    def _arm_timer(self, at: Optional[float] = None) -> None:
        self._cancel_timer()
        when = self._last_read + self._pool.read_timeout if at is None else at
        self._timer = self._pool.loop.call_at(when, self._check_timeout)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_timeout(self) -> None:
        self._timer = None
        if self.closed:
            return
        now = self._pool.loop.time()
        if self._ended or self._failed is not None or self._paused:
            # Idle between requests, or paused by our slow client: not the upstream's silence.
            self._arm_timer(now + self._pool.read_timeout)
            return
        if now < self._last_read + self._pool.read_timeout:
            self._arm_timer()
            return
        message = f"no bytes from the upstream for {self._pool.read_timeout:g} s"
        self._fail("timeout", UpstreamTimeout(message) if self._head is not None and not self._head.done()
                   else asyncio.TimeoutError(message))
        self._close()


#: An upgrade's reply head, as any head we read (`MAX_HEAD_BYTES` of the server side).
_UPGRADE_HEAD_LIMIT = 64 * 1024


class UpgradeReply(NamedTuple):
    """The upstream's answer to an upgrade: its head (parsed, and ``raw`` as it came), and the
    connection as a tunnel when it switched protocols (101)."""

    status: int
    reason: bytes
    headers: Headers
    raw: bytes
    tunnel: Optional[StreamTunnel]


def _parse_head(raw: bytes) -> tuple[int, bytes, Headers]:
    lines = raw.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise UpstreamProtocolError(f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
    headers: Headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(b":")
            headers.append((name.strip(), value.strip()))
    return int(parts[1]), parts[2] if len(parts) > 2 else b"", headers


class UpstreamPool:
    """Keep-alive connections to one upstream base URL."""

    def __init__(self, base_url: str, connect_timeout: float, read_timeout: float,
                 idle_reuse: float = IDLE_REUSE_SECONDS, ca_file: Optional[str] = None) -> None:
        parts = urlsplit(base_url)
        self.base_url = base_url.rstrip("/")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        # HTTPS upstreams are verified against the system's CAs, or ``ca_file`` (``--upstream-ca``:
        # a private CA or a self-signed certificate of a TLS-terminated vLLM).
        self.ssl: Optional[ssl.SSLContext] = ssl.create_default_context(cafile=ca_file) if parts.scheme == "https" else None
        self.idle_reuse = idle_reuse
        default_port = (parts.scheme == "https" and self.port == 443) or (parts.scheme == "http" and self.port == 80)
        self.host_header = (parts.netloc.rpartition("@")[2] if default_port or parts.port else f"{self.host}:{self.port}").encode("idna")
        #: Prepended to every target: a base URL may carry a path (``http://gw/openai``).
        self.base_path = parts.path.rstrip("/").encode()
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.loop = asyncio.get_running_loop()
        self._idle: list[UpstreamConnection] = []
        self._all: set[UpstreamConnection] = set()

    async def request(self, method: str, target: bytes, headers: Headers, body: bytes, has_body: bool) -> UpstreamReply:
        """Send one request and wait for the head of its reply."""
        head = [b"%s %s%s HTTP/1.1\r\nHost: %s\r\n" % (method.encode(), self.base_path, target, self.host_header)]
        for name, value in headers:
            head.append(b"%s: %s\r\n" % (name, value))
        if has_body or body:
            head.append(b"Content-Length: %d\r\n" % len(body))
        head.append(b"\r\n")
        message = b"".join(head) + body
        head_only = method == "HEAD"
        started = perf_counter()
        connection, reused = await self._acquire()
        connected = perf_counter() - started
        try:
            reply = await connection.send(message, head_only)
            reply.connect_seconds = connected
            return reply
        except UpstreamProtocolError:
            if not (reused and connection.received == 0 and method in IDEMPOTENT_METHODS):
                raise
        # A reused keep-alive connection the server closed as we sent: an idempotent request may
        # go once more on a new connection. A POST may have been read and acted on before the
        # close, so it is not resent (the client gets a 502 and decides, as behind nginx).
        started = perf_counter()
        connection = await self._connect()
        connected += perf_counter() - started
        reply = await connection.send(message, head_only)
        reply.connect_seconds = connected
        return reply

    async def upgrade(self, target: bytes, headers: Headers) -> "UpgradeReply":
        """Send an upgrade request (``GET`` with its ``Upgrade`` and ``Connection`` headers) on a
        connection of its own, never pooled, and read the reply's head. A ``101`` hands back the
        connection as a tunnel; any other reply is closed (its head is all a caller uses)."""
        head = [b"GET %s%s HTTP/1.1\r\nHost: %s\r\n" % (self.base_path, target, self.host_header)]
        for name, value in headers:
            head.append(b"%s: %s\r\n" % (name, value))
        head.append(b"\r\n")
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=_UPGRADE_HEAD_LIMIT),
                self.connect_timeout)
        except asyncio.TimeoutError as exc:
            raise UpstreamConnectError(f"connect timeout after {self.connect_timeout:g} s") from exc
        except OSError as exc:
            raise UpstreamConnectError(f"{type(exc).__name__}: {exc}") from exc
        try:
            writer.write(b"".join(head))
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.read_timeout)
        except asyncio.TimeoutError as exc:
            writer.close()
            raise UpstreamTimeout(f"no reply head within {self.read_timeout:g} s") from exc
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as exc:
            writer.close()
            raise UpstreamProtocolError(f"the upgrade's reply head did not arrive whole: {exc}") from exc
        status, reason, reply_headers = _parse_head(raw)
        if status != 101:
            writer.close()
            return UpgradeReply(status, reason, reply_headers, raw, None)
        return UpgradeReply(status, reason, reply_headers, raw, StreamTunnel(reader, writer))

    async def _acquire(self) -> tuple[UpstreamConnection, bool]:
        """The most recently idle connection that is young enough and still open, else a new one.

        Two guards against reusing a connection the upstream is closing (the stale-connection
        race that would otherwise make a POST fail): idle connections are reused only below the
        upstream's keep-alive (``idle_reuse``), and a connection whose socket already holds the
        upstream's FIN (or any unsolicited byte) is dropped rather than reused.
        """
        now = self.loop.time()
        while self._idle:
            connection = self._idle.pop()
            idle = now - connection.idle_since
            if not connection.closed and idle < self.idle_reuse and (idle < PEEK_AFTER_IDLE_SECONDS or connection.quiet()):
                return connection, True
            connection._close()
        return await self._connect(), False

    async def _connect(self) -> UpstreamConnection:
        try:
            _, connection = await asyncio.wait_for(
                self.loop.create_connection(lambda: UpstreamConnection(self), self.host, self.port, ssl=self.ssl),
                self.connect_timeout)
        except asyncio.TimeoutError as exc:
            raise UpstreamConnectError(f"connect timeout after {self.connect_timeout:g} s") from exc
        except OSError as exc:
            raise UpstreamConnectError(f"{type(exc).__name__}: {exc}") from exc
        self._all.add(connection)
        return connection

    def give_back(self, connection: UpstreamConnection) -> None:
        if len(self._idle) >= MAX_IDLE:
            connection._close()
            return
        connection.idle_since = self.loop.time()
        self._idle.append(connection)

    def forget(self, connection: UpstreamConnection) -> None:
        self._all.discard(connection)
        try:
            self._idle.remove(connection)
        except ValueError:
            pass

    def close(self) -> None:
        for connection in list(self._all):
            connection._close()
        self._idle.clear()

