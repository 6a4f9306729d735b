"""The sidecar's HTTP/1.1 server connection: requests in, replies out, nothing added (docs/wire.md).

Why not aiohttp's server: on this path it costs about 130 µs of Python per request before any
proxying (issue 5 measured 7,700 canned replies/s against nginx's 21,000 proxied ones). This is
one ``asyncio.Protocol`` over httptools -- llhttp, the same parser aiohttp's C extension uses --
that hands each complete request to a handler coroutine and writes the reply bytes it is given.

One request at a time per connection; pipelined requests wait their turn. A client that goes
away cancels its handler (the forwarder then stops the upstream and records ``cancelled``).

The rules a proxy owes its clients, as nginx keeps them (README, "On the wire"): a request head
is counted as its bytes arrive (over 64 KiB: 431) and must arrive whole within the head timeout
(slowloris: 408); HEAD, 1xx, 204 and 304 replies carry no body and no body framing; Upgrade and
CONNECT get a 501 in their turn and nothing goes upstream; ``100 Continue`` goes only to HTTP/1.1
clients, and only when their request's turn has come (never inside another reply).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Awaitable, Callable, Optional

import httptools

from ._headers import Headers, first_values
from ._reply_writer import ReplyWriter
from ._tunnel import ServerTunnel

log = logging.getLogger("mcc.http")

#: Request line plus headers; more gets a 431 (aiohttp allowed 8 KiB per line; agents send tokens).
MAX_HEAD_BYTES = 64 * 1024
#: Pipelined requests held while one is served, before reading pauses.
MAX_PIPELINED = 16
#: A connection with no request in flight that sends nothing for this long is closed (aiohttp's
#: default too); clients' pools reconnect transparently.
KEEPALIVE_IDLE_SECONDS = 75.0

class ServerRequest:
    """One complete request as received: raw target, raw headers in order, the whole body."""

    __slots__ = ("method", "target", "headers", "fields", "body", "keep_alive", "has_body", "too_large", "http10",
                 "refusal", "upgrade")

    def __init__(self, method: str, target: bytes, headers: Headers, keep_alive: bool, has_body: bool,
                 fields: Optional[dict[bytes, bytes]] = None) -> None:
        self.method = method
        self.target = target
        self.headers = headers
        #: The first value of each field by its lower-case name, gathered as the head was parsed:
        #: a lookup instead of a scan of ``headers`` (`header_value`).
        self.fields = fields if fields is not None else first_values(headers)
        self.body = b""
        self.keep_alive = keep_alive
        self.has_body = has_body
        #: The body exceeded the limit: it was not read, and the connection closes after the reply.
        self.too_large = False
        self.http10 = False
        #: (status, reason, message) of a local refusal answered in this request's turn (Upgrade, CONNECT).
        self.refusal: Optional[tuple[int, bytes, bytes]] = None
        #: A WebSocket upgrade (``GET`` with ``Upgrade: websocket``) the handler may take over
        #: (`Http1Connection.take_over`), or answer; the connection ends with it either way.
        self.upgrade = False

    def value(self, name: bytes) -> Optional[bytes]:
        """The first value of the field ``name`` (lower case), else None."""
        return self.fields.get(name)


Handler = Callable[[ServerRequest, ReplyWriter], Awaitable[None]]


#: After a refusal, how long a client's further input is read and dropped before closing.
LINGER_SECONDS = 2.0
#: A request head must arrive whole within this many seconds (``--head-timeout``).
HEAD_TIMEOUT_SECONDS = 20.0
#: Client connections open at once (``--max-connections``).
MAX_CONNECTIONS = 16384
_last_refusal_log = [0.0]
#: The paths whose upgrade or CONNECT was refused and said (each once; a few dozen at most).
_said_upgrades: set[bytes] = set()


def say_refused_upgrade(method: str, target: bytes, upgrade: Optional[bytes]) -> None:
    """An Upgrade (a WebSocket agent) or CONNECT gets a 501: said once per path, so that an agent
    run failing on it shows why in the log."""
    path = target.split(b"?", 1)[0][:200]
    if path in _said_upgrades or len(_said_upgrades) >= 64:
        return
    _said_upgrades.add(path)
    what = f"Upgrade: {upgrade.decode('latin-1')}" if upgrade is not None else method
    log.warning("refused %s %s with 501: %s is not served (only HTTP/1.1 requests are forwarded, and the Responses "
                "WebSocket mode on /ng-rollout/<rollout_id>/v1/responses)",
                method, path.decode("latin-1"), what, extra={"status": 501, "path": path.decode("latin-1")})


class Http1Connection(asyncio.Protocol):
    """One client connection: the socket, the parser and the pipeline of its requests, served one at
    a time. The handler writes each reply through the `ReplyWriter` it is given (`start` / `write` /
    `end`), one per request."""

    def __init__(self, handler: Handler, max_body_bytes: int, connections: set["Http1Connection"],
                 idle_timeout: float = KEEPALIVE_IDLE_SECONDS, head_timeout: float = HEAD_TIMEOUT_SECONDS,
                 max_connections: int = MAX_CONNECTIONS, websocket_upgrades: bool = False) -> None:
        self._handler = handler
        #: Hand a WebSocket upgrade to the handler (which takes it over or answers it) instead of
        #: refusing it here with a 501.
        self._websocket_upgrades = websocket_upgrades
        #: Bytes after an upgrade's head, held until the handler takes the connection over.
        self._after_upgrade: Optional[bytearray] = None
        self._tunnel: Optional[ServerTunnel] = None
        self._head_timeout = head_timeout
        self._max_connections = max_connections
        #: True while a request head is expected or arriving (its bytes are counted as they come).
        self._in_head = True
        #: Bytes of the head now arriving, counted from the socket (not when a header completes).
        self._raw_head_bytes = 0
        #: When the bytes of the head now arriving began (the head deadline runs from there).
        self._head_started: Optional[float] = None
        self._head_timer: Optional[asyncio.TimerHandle] = None
        #: Further input is ignored (after an Upgrade or CONNECT, whose 501 is queued).
        self._stop_reading = False
        #: A request whose ``100 Continue`` waits for the reply in flight to end.
        self._continue_owed: Optional[ServerRequest] = None
        self._idle_timeout = idle_timeout
        self._last_activity = 0.0
        self._idle_timer: Optional[asyncio.TimerHandle] = None
        self._max_body = max_body_bytes
        self._connections = connections
        self._parser = httptools.HttpRequestParser(self)
        self.transport: Optional[asyncio.Transport] = None
        self._pending: deque[ServerRequest] = deque()
        self._task: Optional[asyncio.Task[None]] = None
        self._current: Optional[ServerRequest] = None
        #: The writer of the reply now being served (`take_over` marks it answered).
        self._writer: Optional[ReplyWriter] = None
        self._url = b""
        self._headers: Headers = []
        self._fields: dict[bytes, bytes] = {}
        self._hosts = 0
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_size = 0
        self._discarding = False
        self.closing = False
        self.gone = False
        #: Set while the client is not reading fast enough (the transport's high-water mark).
        self._paused_writing = False
        #: Called with True / False when writing pauses / resumes (the forwarder's body pump).
        self.on_write_flow: Optional[Callable[[bool], None]] = None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # asyncio gives a transport of the kind its protocol asked for
        if len(self._connections) >= self._max_connections:
            self.gone = True  # A flood: refused on arrival, before any byte is read.
            transport.close()
            now = time.monotonic()
            if now - _last_refusal_log[0] > 10:
                _last_refusal_log[0] = now
                log.warning("refusing connections: %d are open (--max-connections)", len(self._connections))
            return
        self._connections.add(self)
        self._loop = loop = asyncio.get_running_loop()
        self._last_activity = loop.time()
        self._idle_timer = loop.call_later(self._idle_timeout, self._check_idle)

    def data_received(self, data: bytes) -> None:
        self._last_activity = now = self._loop.time()
        if self._after_upgrade is not None:  # Another protocol's bytes now, not HTTP's.
            if self._tunnel is not None:
                self._tunnel.feed(data)
            else:
                self._after_upgrade += data
            return
        if self.closing or self._stop_reading:
            return
        if self._in_head:
            # Counted as the bytes arrive: a header that never ends must not grow without bound.
            # (This counts the head a read begins or continues; the count in the parser's
            # callbacks, still bounds a second, pipelined head that arrives whole in the same read.)
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self._raw_head_bytes += len(data)
                if self._raw_head_bytes > MAX_HEAD_BYTES:
                    self._refuse(431, b"Request Header Fields Too Large", b"request head over 64 KiB")
                    return
                if self._head_started is None:
                    self._head_started = now  # Only a head that needs more than this read gets a deadline.
            elif self._raw_head_bytes + end + 4 > MAX_HEAD_BYTES:
                self._refuse(431, b"Request Header Fields Too Large", b"request head over 64 KiB")
                return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            if self._after_upgrade is not None:  # Handed to the handler: what follows is its protocol's.
                self._after_upgrade += data[upgrade.args[0]:]
                return
            if not self._stop_reading:  # Its 501 is queued (`_refuse_in_turn`); anything else: now.
                self._refuse(501, b"Not Implemented", b"protocol upgrades are not supported")
        except httptools.HttpParserError as exc:  # httptools wraps errors raised in our callbacks too.
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse(431, b"Request Header Fields Too Large", b"request head over 64 KiB")
            else:
                self._refuse(400, b"Bad Request", f"malformed HTTP request: {exc}".encode())
            return
        if self._in_head and self._head_started is not None and self._head_timer is None and not self.closing:
            # A head still incomplete after this read (rare: heads come in one segment) gets a deadline.
            self._head_timer = self._loop.call_at(self._head_started + self._head_timeout, self._head_deadline)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.gone = True
        self._connections.discard(self)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self._head_timer is not None:
            self._head_timer.cancel()
        if self._tunnel is not None:
            self._tunnel.feed_eof()  # The relay sees the end and closes its side.
        elif self._task is not None and not self._task.done():
            self._task.cancel()  # The client left: the handler stops its upstream call.

    def pause_writing(self) -> None:
        self._paused_writing = True
        if self.on_write_flow is not None:
            self.on_write_flow(True)

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self.on_write_flow is not None:
            self.on_write_flow(False)

    # -- httptools callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._in_head = True
        self._url = b""
        self._headers = []
        self._fields = {}
        self._hosts = 0
        self._head_bytes = 0
        self._body = []
        self._body_size = 0
        self._discarding = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        lowered = name.lower()
        if lowered == b"host":
            self._hosts += 1
        self._fields.setdefault(lowered, value)  # The first value, as `header_value` finds it.
        self._head_bytes += len(name) + len(value) + 4  # Counted as the fields arrive (431).
        if self._head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._raw_head_bytes = 0
        self._head_started = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        parser = self._parser
        fields = self._fields
        request = ServerRequest(parser.get_method().decode("ascii", "replace"), self._url, self._headers,
                                parser.should_keep_alive(), False, fields)
        length = fields.get(b"content-length")
        request.has_body = length is not None or b"transfer-encoding" in fields
        self._current = request
        version = parser.get_http_version()
        request.http10 = version == "1.0"
        hosts = self._hosts
        if version not in ("1.0", "1.1"):
            # llhttp reads a request line without a version as HTTP/0.9; a model call never is one.
            self._refuse_in_turn(request, 400, b"Bad Request", b"only HTTP/1.0 and HTTP/1.1 requests are served")
        elif hosts > 1 or (hosts == 0 and not request.http10):
            # RFC 9112 §3.2: a server MUST answer 400 to an HTTP/1.1 request without a Host header,
            # or to any request with more than one (nginx does the same).
            self._refuse_in_turn(request, 400, b"Bad Request", b"a request must carry exactly one Host header")
        elif request.http10 and b"transfer-encoding" in fields:
            # HTTP/1.0 has no transfer codings: such a body's framing cannot be trusted (RFC 9112
            # §6.1; nginx answers 400).
            self._refuse_in_turn(request, 400, b"Bad Request", b"an HTTP/1.0 request cannot use Transfer-Encoding")
        elif (self._websocket_upgrades and request.method == "GET" and parser.should_upgrade()
              and fields.get(b"upgrade", b"").strip().lower() == b"websocket"):
            request.upgrade = True  # The handler takes it over (or answers it); nothing after it is HTTP.
            request.keep_alive = False
            self._after_upgrade = bytearray()
        elif request.method == "CONNECT" or parser.should_upgrade():
            # Not a proxy for tunnels or other protocols: 501 in this request's turn, nothing
            # upstream, no byte after it read (what follows would be the other protocol's).
            say_refused_upgrade(request.method, request.target, fields.get(b"upgrade"))
            self._refuse_in_turn(request, 501, b"Not Implemented",
                                 b"protocol upgrades and CONNECT are not supported by this sidecar")
        elif length is not None and length.strip().isdigit() and int(length) > self._max_body:
            self._too_large(request)
        elif (request.has_body and not request.http10 and self.transport is not None
              and fields.get(b"expect", b"").lower() == b"100-continue"):
            # RFC 9110 §10.1.1: never to an HTTP/1.0 client; and not while another reply is being
            # written on this connection (it would land inside that reply's body).
            if self._task is None and not self._pending:
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            else:
                self._continue_owed = request

    def on_body(self, body: bytes) -> None:
        if self._discarding:
            return
        self._body_size += len(body)
        if self._body_size > self._max_body and self._current is not None:
            self._too_large(self._current)
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_head = True
        request, self._current = self._current, None
        if self._continue_owed is request:
            self._continue_owed = None  # The body came without waiting: no 100 is owed any more.
        if request is None or self._discarding:
            return
        request.body = b"".join(self._body)
        self._body = []
        self._enqueue(request)

    # -- serving -----------------------------------------------------------------------------

    def _too_large(self, request: ServerRequest) -> None:
        """Answer without reading the body (a local 413), then close: the rest of the body is junk."""
        request.too_large = True
        request.keep_alive = False
        self._discarding = True
        self._current = None
        self._enqueue(request)

    def _refuse_in_turn(self, request: ServerRequest, status: int, reason: bytes, message: bytes) -> None:
        request.refusal = (status, reason, message)
        request.keep_alive = False
        self._discarding = True
        self._stop_reading = True
        self._current = None
        self._enqueue(request)

    def _head_deadline(self) -> None:
        """A request head still incomplete at its deadline (slowloris): 408, and the connection closes."""
        self._head_timer = None
        if self.gone or not self._in_head or self._head_started is None:
            return
        if self._loop.time() < self._head_started + self._head_timeout:
            self._head_timer = self._loop.call_at(self._head_started + self._head_timeout, self._head_deadline)
            return
        self._refuse(408, b"Request Timeout", b"the request head did not arrive in time")

    def _send_owed_continue(self) -> None:
        """The reply in flight has ended: a ``100 Continue`` owed to the request being received goes now."""
        owed, self._continue_owed = self._continue_owed, None
        if owed is not None and owed is self._current and self.transport is not None and not self.gone:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _enqueue(self, request: ServerRequest) -> None:
        self._pending.append(request)
        if len(self._pending) > MAX_PIPELINED and self.transport is not None:
            self.transport.pause_reading()
        if self._task is None:
            self._task = asyncio.ensure_future(self._serve())

    async def _serve(self) -> None:
        try:
            while self._pending and not self.gone:
                request = self._pending.popleft()
                if self.transport is not None and len(self._pending) == MAX_PIPELINED:
                    self.transport.resume_reading()
                # The writer frames its reply by the request (`ReplyWriter.start`).
                writer = self._writer = ReplyWriter(self, request)
                self.on_write_flow = None
                try:
                    if request.refusal is not None:
                        status, reason, message = request.refusal
                        self.closing = True  # Nothing after it was read: the reply says so, then we close.
                        writer.reply(status, reason, [(b"Content-Type", b"text/plain; charset=utf-8")], message)
                    else:
                        await self._handler(request, writer)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("unexpected error handling %s", request.method)
                    if not writer.response_started:
                        writer.reply(500, b"Internal Server Error", [(b"Content-Type", b"text/plain")], b"internal error")
                if not writer.response_ended or not request.keep_alive or self.closing:
                    self.close()
                    return
                if self._continue_owed is not None and not self._pending:
                    self._send_owed_continue()
        finally:
            self._task = None
            self._last_activity = self._loop.time()  # Idle from the end of the last reply.
        if self.closing:
            self.close()

    def take_over(self) -> ServerTunnel:
        """The connection, for the upgrade now being answered: its bytes from here on, both ways.
        The handler has written its ``101`` (or relayed the upstream's) first."""
        assert self.transport is not None and self._after_upgrade is not None
        tunnel = self._tunnel = ServerTunnel(self.transport, bytes(self._after_upgrade))
        self._after_upgrade.clear()
        self.on_write_flow = tunnel.writing_paused
        if self._paused_writing:
            tunnel.writing_paused(True)
        if self.gone:
            tunnel.feed_eof()
        if self._writer is not None:
            self._writer.response_started = self._writer.response_ended = True
        return tunnel

    @property
    def writing_paused(self) -> bool:
        """The client is not reading fast enough (the transport's high-water mark)."""
        return self._paused_writing

    def abort(self) -> None:
        """Cut the connection so the client sees the failure, as it would directly."""
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        self.closing = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def shut_down(self) -> None:
        """Graceful stop: an idle connection closes now, a busy one after its current reply; a
        taken-over one is told (its handler says goodbye in its protocol, between messages)."""
        self.closing = True
        if self._tunnel is not None:
            self._tunnel.shut_down()
        if self._task is None:
            self.close()

    @property
    def task(self) -> Optional["asyncio.Task[None]"]:
        """The task serving this connection's current request, if any."""
        return self._task

    @property
    def busy(self) -> bool:
        return self._task is not None

    def _check_idle(self) -> None:
        """Close a connection that sent nothing for the idle timeout while no reply was in flight
        (a keep-alive connection its client forgot, or one that never finished a request head)."""
        self._idle_timer = None
        if self.gone:
            return
        loop, busy = self._loop, self._task is not None
        idle_until = self._last_activity + self._idle_timeout
        if not busy and loop.time() >= idle_until:
            self.close()
            return
        self._idle_timer = loop.call_at(loop.time() + self._idle_timeout if busy else idle_until, self._check_idle)

    def _refuse(self, status: int, reason: bytes, message: bytes) -> None:
        self.closing = True
        if self._task is None and self.transport is not None and not self.gone:
            # Not the last request's (None): a refusal always has its body.
            ReplyWriter(self, None).reply(status, reason, [(b"Content-Type", b"text/plain; charset=utf-8")], message)
            self._linger()
            return
        self.close()

    def _linger(self) -> None:
        """Close after a refusal without losing it: a client still sending (a huge head) would get a
        TCP reset that discards our reply if we closed with its bytes unread. As nginx's
        ``lingering_close``: stop writing, read and drop its input for a moment, then close."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if transport.can_write_eof():
            transport.write_eof()
        self._loop.call_later(LINGER_SECONDS, self.close)


class _HeadTooLarge(Exception):
    """Raised from a callback to stop the parser; seen as an `HttpParserError`."""
