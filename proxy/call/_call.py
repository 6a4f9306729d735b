"""The proxy handler: forward one request upstream and pump the reply back, byte for byte.

The handler only moves bytes and hands a copy of each reply chunk to the tap (DESIGN §2). For a
captured call it holds back exactly one chunk -- the one that completes the terminal event, or
the last chunk of a non-streaming body -- until the call's line is durable: when an agent has
seen the end of a reply, its record is on disk.

`_Call.run` is the whole story of one call; `_BodyPump` is its hot path, run from the upstream
connection's own callbacks so that a chunk costs one tap feed and one socket write, no task switch.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import TYPE_CHECKING, Callable, Optional

from capture import AddedFieldCutter, BodyTap, StreamTap

from ._exchange import CallExchange, Failure
from ..http._headers import client_response_headers, upstream_request_headers, with_session_affinity, with_trace_context
from ..http._server import Http1Connection, ServerRequest
from ._local_replies import (
    BAD_REQUEST_TARGET,
    BODY_TOO_LARGE,
    INVALID_ROLLOUT_ID,
    UPSTREAM_TIMEOUT,
    UPSTREAM_UNREACHABLE,
    LocalReply,
    error_body,
    send_local_reply,
)
from ._metrics import status_class
from ._routing import OBSERVED_PATHS, Route, base_url_mistake, route_request
from ..training._token_hooks import TokenCall
from ..training._token_mode import UpstreamBroke, WholeBody
from ..http._checks import certificate_problem
from ..http._upstream import UpstreamConnectError, UpstreamProtocolError, UpstreamReply, UpstreamTimeout


if TYPE_CHECKING:
    from ..app._sidecar import Sidecar

log = logging.getLogger("mcc.proxy")
#: With ``--capture-raw-stream on-failure``, the raw text of a stream that parses cleanly is kept
#: only this far back (it is written only if the stream then fails): the last ~200 events of a
#: logprob stream, which is what says how it failed; 1,024 streams x 64-128 KiB (issue 34).
RAW_WINDOW_BYTES = 64 * 1024
access_log = logging.getLogger("mcc.access")


async def forward(sidecar: "Sidecar", request: ServerRequest, client: Http1Connection) -> None:
    """Handle any request that is not an admin endpoint."""
    metrics = sidecar.metrics
    metrics.requests_in_flight += 1
    route, call = None, None
    try:
        target = request.target.decode("latin-1")
        if not target.startswith("/"):
            # RFC 9112 §3.2.2: a server MUST accept the absolute-form (`GET http://host/v1/models`).
            # Its path is what is forwarded; its host is not: only the configured upstream is
            # ever reached, whatever the client names.
            target = origin_form(target)  # type: ignore[assignment]
            if target is None:
                send_local_reply(client, BAD_REQUEST_TARGET, "openai",
                                 "the request target must be a path or an http(s) URL; this sidecar only forwards "
                                 "to its configured upstream")
                return
        route = route_request(request.method, target)
        if route.invalid_rollout_id is not None:
            message = (f"invalid rollout id {route.invalid_rollout_id!r} in the /ng-rollout/ prefix: expected "
                       "1-200 characters of [A-Za-z0-9._-] starting with a letter or digit")
            send_local_reply(client, INVALID_ROLLOUT_ID, route.error_dialect, message)
            return
        if route.rollout_id is None and sidecar.capture_writer is not None and request.method == "POST":
            _say_uncaptured(sidecar, route)
        call = _Call(sidecar, request, client, route)
        await call.run()
    finally:
        metrics.requests_in_flight -= 1
        captured = "true" if call is not None and call.exchange is not None else "false"
        dialect = (route.dialect if route is not None else None) or "none"
        status = call.status if call is not None else (BAD_REQUEST_TARGET.status if route is None else INVALID_ROLLOUT_ID.status)
        metrics.requests.inc(1, (dialect, status_class(status), captured))
        if access_log.isEnabledFor(logging.DEBUG):  # The access log: --log-level debug.
            access_log.debug("%s %s %s captured=%s", request.method, request.target.decode("latin-1"), status, captured,
                             extra={"status": status, "method": request.method,
                                    "rollout_id": route.rollout_id if route is not None else None})


class _Call:
    """The state of one forwarded request; `run` is the whole story in one screen."""

    def __init__(self, sidecar: "Sidecar", request: ServerRequest, client: Http1Connection, route: Route) -> None:
        self.sidecar = sidecar
        self.request = request
        self.client = client
        self.route = route
        self.settings = sidecar.settings
        self.writer = sidecar.capture_writer
        self.metrics = sidecar.metrics
        self.exchange: CallExchange | None = None
        self.persisted = False
        self.status: Optional[int] = None
        #: The token capture mode's side of this call (DESIGN §11, §12).
        self.tokens = TokenCall(self)

    async def run(self) -> None:
        if self.request.too_large:
            self.sidecar.repeated_warnings.warning("413", "refused a request body over the limit of %d bytes (413) for %s",
                                       self.settings.max_body_bytes, self.route.upstream_target,
                                       extra={**self._log_context(), "status": 413})
            self._open_exchange(b"")
            await self._answer_locally(BODY_TOO_LARGE, "request", None, retryable=False,
                                       message=f"request body exceeds the sidecar's limit of {self.settings.max_body_bytes} bytes")
            return
        self._open_exchange(self.request.body)
        body = self.tokens.request_body(self.request.body)
        # The call's lineage and its intent (DESIGN §12) are prepared while the request goes
        # upstream, and awaited before the agent gets a byte of the reply (issue 34); prefix
        # supply needs the lineage before the request.
        self.tokens.plan_entry_soon()
        if self.settings.supply_prefix:
            await self.tokens.planned()
        body = await self.tokens.supply_prefix(body)
        try:
            upstream = await self._send_upstream(body)
            if self.tokens.must_resend(upstream):
                upstream = await self.tokens.resend_own_request(upstream)
            await self.tokens.planned()
        except asyncio.CancelledError:
            self._client_gone_before_reply()
            raise
        except UpstreamConnectError as exc:
            await self.tokens.planned()
            await self._upstream_failed("connect", UPSTREAM_UNREACHABLE, "upstream_connect", exc)
            return
        except UpstreamTimeout as exc:
            await self.tokens.planned()
            await self._upstream_failed("timeout", UPSTREAM_TIMEOUT, "upstream_response", exc)
            return
        except (UpstreamProtocolError, OSError) as exc:
            await self.tokens.planned()
            await self._upstream_failed("protocol", UPSTREAM_UNREACHABLE, "upstream_response", exc)
            return
        try:
            await self._relay(upstream)
        finally:
            upstream.close()  # Back to the pool if the reply ended; closed mid-body, the GPU stops.

    # -- request side ----------------------------------------------------------------------

    def _open_exchange(self, body: bytes) -> None:
        if self.writer is None or self.route.dialect is None:
            return
        request = self.request
        self.exchange = CallExchange(
            rollout_id=self.route.rollout_id or "",
            dialect=self.route.dialect,
            model_name=self.sidecar.model_ref_name,
            request_body=body,
            request_headers=request.headers,
            correlation_headers=(self.settings.session_id_header, self.settings.assistant_message_id_header),
            raw_stream=self.settings.capture_raw_stream,
        )
        if body:
            self.exchange.retry_of = self.sidecar.retries.note(self.exchange.rollout_id, body, self.exchange.model_call_id)

    async def _send_upstream(self, body: bytes) -> UpstreamReply:
        if self.exchange is not None:
            self.exchange.start()
            if self.exchange.weight_watch is None:
                self.exchange.weight_watch = self.sidecar.weight_versions.watch(self.exchange)
        request = self.request
        headers = upstream_request_headers(request.headers)
        if self.exchange is not None and self.settings.trace_context:
            headers = with_trace_context(headers, self.exchange.rollout_id, self.exchange.model_call_id)
        if self.exchange is not None and self.tokens.on:
            headers = with_session_affinity(headers, self.exchange.rollout_id)
        return await self.sidecar.upstream.request(request.method, self.route.upstream_target.encode("latin-1"),
                                                   headers, body, request.has_body)

    # -- reply side ------------------------------------------------------------------------

    async def _relay(self, upstream: UpstreamReply) -> None:
        is_stream = (upstream.header(b"content-type") or b"").split(b";")[0].strip().lower() == b"text/event-stream"
        if is_stream:
            self.metrics.streams_in_flight += 1
        try:
            await self._relay_body(upstream, is_stream)
        finally:
            if is_stream:
                self.metrics.streams_in_flight -= 1
            self.tokens.say_uncut()

    async def _relay_body(self, upstream: UpstreamReply, is_stream: bool) -> None:
        self.status = upstream.status
        if upstream.status == 404:
            mistake = base_url_mistake(self.route.upstream_target)
            if mistake is not None and mistake not in self.sidecar.hinted:  # Said once per sidecar and kind.
                self.sidecar.hinted.add(mistake)
                log.warning("the upstream answered 404 for %s (forwarded unchanged): %s", self.route.upstream_target,
                            mistake, extra={**self._log_context(), "status": 404})
        cutter = self.tokens.cutter_for(upstream)
        tap = self._attach_tap(upstream, is_stream, cutter)
        if cutter is not None and (not is_stream or upstream.content_length is not None):
            await self._relay_cut_body(upstream, tap, cutter, is_stream)  # A sized body: its length changes.
            return
        if isinstance(tap, BodyTap) and upstream.content_length == 0:
            await self._persist_now()  # The headers alone are the whole reply.
        await self.tokens.intent_durable()  # Bytes may reach the agent before the line.
        self.client.start(upstream.status, upstream.reason, client_response_headers(upstream.headers), upstream.chunked)
        pump = _BodyPump(self, upstream, tap, cutter)  # Delivers the body bytes that came with the head.
        if not pump.persisting:
            self.client.flush_head()  # Else the head waits, with the held chunk, for the line.
        try:
            outcome = await pump.done
        except asyncio.CancelledError:
            pump.stop()
            self._client_gone_before_reply()
            raise
        if outcome == "client_gone":
            self._client_gone_before_reply()
        elif outcome == "upstream_broke":
            self.client.abort()  # The client sees the failure as it would have directly.

    async def _relay_cut_body(self, upstream: UpstreamReply, tap: StreamTap | BodyTap | None,
                              cutter: AddedFieldCutter, is_stream: bool) -> None:
        """A JSON body under the token capture mode: read whole, cut whole, its Content-Length
        recomputed (DESIGN §11); the line is durable before the agent gets a byte of it."""
        sink = WholeBody()
        upstream.attach(sink)
        try:
            body = await sink.done
        except UpstreamBroke as broke:  # As a direct call would: what came, then the cut.
            if tap is not None:
                tap.feed(broke.partial)
            await self.tokens.intent_durable()
            self.client.start(upstream.status, upstream.reason, client_response_headers(upstream.headers), upstream.chunked)
            self.client.write(broke.partial)
            self.upstream_broke_then(broke.kind, self.client.abort)
            return
        except asyncio.CancelledError:
            self._client_gone_before_reply()
            raise
        if tap is not None:
            tap.feed(body)
            if self.exchange is not None:
                self.exchange.mark_first_content()
        if isinstance(tap, StreamTap):  # Framed and cut by the tap's one reader, as a chunked stream is.
            cut = tap.take_output() + tap.close_output()
        else:
            cut = cutter.cut_body(body)
        headers = client_response_headers(upstream.headers)
        if upstream.content_length is not None:
            length = str(len(cut)).encode()
            headers = [(name, length if name.lower() == b"content-length" else value) for name, value in headers]
        await self._persist_now()
        self.client.start(upstream.status, upstream.reason, headers, upstream.chunked)
        self.client.write(cut)
        self.client.end()

    def _attach_tap(self, upstream: UpstreamReply, is_stream: bool,
                    cutter: AddedFieldCutter | None = None) -> StreamTap | BodyTap | None:
        if self.exchange is None:
            return None
        self.exchange.status_code = self.exchange.upstream_status_code = upstream.status
        encoding = _text(upstream.header(b"content-encoding"))
        if is_stream:
            # The line is all that reads the reassembly: per-token lists stay JSON (memory, issue 20).
            window = RAW_WINDOW_BYTES if self.settings.capture_raw_stream == "on-failure" else None
            self.exchange.tap = StreamTap(self.exchange.dialect, encoding, compact_arrays=True, raw_window=window,
                                          cutter=cutter)
        else:
            self.exchange.tap = BodyTap(self.exchange.dialect, encoding)
        return self.exchange.tap

    # -- outcomes --------------------------------------------------------------------------

    def persist_then(self, then: Callable[[], None], holding_back: bool = True) -> None:
        """Complete the exchange and make its line durable, then call ``then()`` (on the loop).

        The pump's form of `_persist_now`: no task, no future. With ``holding_back`` the wait is
        measured as the terminal chunk's hold-back (DESIGN §2).
        """
        exchange = self.exchange
        if exchange is None or self.persisted:
            then()
            return
        self.persisted = True
        self._complete(exchange)
        started = time.perf_counter()

        def settled(_: bool) -> None:
            if holding_back:
                self.metrics.terminal_holdback.observe(time.perf_counter() - started)
            then()

        self.writer.submit(exchange, settled)  # type: ignore[union-attr]

    async def _persist_now(self) -> None:
        """Complete the exchange and make its line durable; once per call."""
        if self.exchange is None or self.persisted:
            return
        self.persisted = True
        self._complete(self.exchange)
        if not await self.writer.persist(self.exchange):  # type: ignore[union-attr]
            await self.tokens.intent_durable()  # The line's barrier, which was to cover it, failed.

    def _complete(self, exchange: CallExchange) -> None:
        exchange.complete()
        metrics = self.metrics
        metrics.request_duration.observe((exchange.latency_ms or 0) / 1000, (exchange.dialect,))
        if exchange.latency_ttft_ms is not None:
            metrics.ttft.observe(exchange.latency_ttft_ms / 1000, (exchange.dialect,))
        tap = exchange.tap
        if (isinstance(tap, StreamTap) and not tap.terminal and exchange.category_override != "cancelled"
                and 200 <= (exchange.status_code or 0) < 300):
            self.metrics.streams_truncated.inc()

    def _client_gone_before_reply(self) -> None:
        self.metrics.client_disconnects.inc()
        if self.exchange is None or self.persisted:
            return
        self.persisted = True
        self.exchange.category_override = "cancelled"
        if self.sidecar.cut_by_drain:
            self.exchange.failure = Failure("client", "cancelled", "the sidecar was shutting down and its drain timeout "
                                            f"({self.settings.drain_timeout:g}s) ended before the reply did", None, True)
        else:
            self.exchange.failure = Failure("client", "cancelled", "the client disconnected before the reply ended")
        self._complete(self.exchange)
        # Written even though nobody waits: closing the writer (shutdown) writes what is queued.
        self.writer.submit(self.exchange, _ignore)  # type: ignore[union-attr]

    def upstream_broke_then(self, kind: str, then: Callable[[], None]) -> None:
        self.metrics.upstream_errors.labels(kind).inc()
        self.sidecar.repeated_warnings.warning(("mid-reply", kind), "upstream %s failed mid-reply (%s) for %s", self.sidecar.upstream_url,
                                   kind, self.route.upstream_target, extra=self._log_context())
        self.persist_then(then, holding_back=False)

    async def _upstream_failed(self, kind: str, reply: LocalReply, stage: str, exc: BaseException) -> None:
        self.metrics.upstream_errors.labels(kind).inc()
        certificate = _certificate_error(exc)
        if certificate is not None:
            # Not retryable: every call fails the same way until the sidecar is given the CA.
            message = f"the upstream model server at {self.sidecar.upstream_url}: {certificate_problem(certificate)}"
            self.sidecar.repeated_warnings.warning(("before-reply", "tls"), "%s", message,
                                                   extra={**self._log_context(), "status": reply.status})
            await self._answer_locally(reply, stage, certificate, retryable=False, message=message)
            return
        self.sidecar.repeated_warnings.warning(("before-reply", kind), "upstream %s failed before replying (%s): %s: %s",
                                   self.sidecar.upstream_url, kind, type(exc).__name__, exc,
                                   extra={**self._log_context(), "status": reply.status, "errno": _errno_of(exc)})
        await self._answer_locally(reply, stage, exc, retryable=True)

    def _log_context(self) -> dict[str, object]:
        return {"rollout_id": self.route.rollout_id, "upstream": self.sidecar.upstream_url,
                "path": self.route.upstream_target, "method": self.request.method}

    async def _answer_locally(self, reply: LocalReply, stage: str, exc: BaseException | None,
                              retryable: bool, message: str | None = None) -> None:
        if message is None:
            message = _describe_upstream_failure(reply, self.sidecar.upstream_url, exc)
        self.status = reply.status
        if self.exchange is not None:
            failure = Failure(stage, reply.category, message, type(exc).__name__ if exc else None, retryable)
            self.exchange.answer_locally(reply.status, reply.reason, reply.category, failure,
                                         error_body(reply, self.route.error_dialect, message))
            await self._persist_now()
        send_local_reply(self.client, reply, self.route.error_dialect, message)


class _BodyPump:
    """Moves one reply body from the upstream connection to the client, from the upstream's callbacks.

    Per chunk: feed the tap, write to the client. The chunk that ends a captured reply is held
    (and the upstream paused) until the line is durable. A slow client pauses the upstream.
    ``done`` resolves to ``ended``, ``client_gone`` or ``upstream_broke``.
    """

    def __init__(self, call: _Call, upstream: UpstreamReply, tap: StreamTap | BodyTap | None,
                 cutter: AddedFieldCutter | None = None) -> None:
        self.call = call
        self.upstream = upstream
        self.client = call.client
        self.tap = tap
        #: Token capture mode: what the client gets is the stream with the added fields cut.
        self.cutter = cutter
        #: Where body bytes go: the client's socket, through the cutter when there is one.
        self.write = call.client.write if cutter is None else self._write_cut
        self.exchange = call.exchange
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        #: Bytes still expected of a sized body (a captured BodyTap), else None.
        self.remaining = upstream.content_length if isinstance(tap, BodyTap) else None
        #: Lookahead for a captured body of unknown length: its last chunk is held to the end.
        self.lookahead = isinstance(tap, BodyTap) and upstream.content_length is None
        self.held = b""
        #: Token capture mode: the held terminal chunk's bytes, already cut (they go out first).
        self.held_ready = b""
        self.first_written = False
        self.persisting = False
        self.ended = False
        #: Set when the upstream failed mid-reply: ``reset_mid_reply`` or ``timeout_mid_reply``.
        self.broken: Optional[str] = None
        self.client.on_write_flow = self._client_flow
        if self.client.writing_paused:
            upstream.pause()
        upstream.attach(self)

    # -- BodySink ------------------------------------------------------------------------------

    def on_read(self, batch: list[bytes]) -> None:
        """The chunks of one upstream read: each fed to the tap, all written in one client write.

        When a chunk completes the reply, the bytes before it go out now and it is held, with
        whatever follows it, until the line is durable.
        """
        if self.done.done():
            return
        if self.client.gone:
            self._finish("client_gone")
            return
        tap, write = self.tap, self.write
        if tap is None or self.call.persisted:
            write(batch[0] if len(batch) == 1 else b"".join(batch))
            return
        if self.persisting:  # Bytes behind the held chunk wait with it, in order.
            self.held += b"".join(batch)
            return
        if type(tap) is StreamTap:
            self._flush_stream(batch[0] if len(batch) == 1 else b"".join(batch), tap)
            return
        exchange, start = self.exchange, 0
        for index, chunk in enumerate(batch):
            ends_reply = tap.feed(chunk)
            if exchange is not None and exchange.latency_ttft_ms is None and tap.has_content:
                exchange.mark_first_content()
            if self.remaining is not None:
                self.remaining -= len(chunk)
                ends_reply = self.remaining <= 0
            if ends_reply:
                write(b"".join(batch[start:index]))
                self.held = b"".join(batch[index:])
                self._persist_then_flush()
                return
            if not self.first_written and not self.lookahead:
                self.first_written = True  # The first bytes go out before the rest is parsed: TTFT.
                write(chunk)
                start = index + 1
        batch = batch[start:]
        if not batch and not self.lookahead:
            return
        data = batch[0] if len(batch) == 1 else b"".join(batch)
        if self.lookahead:  # Write what came before; this read may be the body's last.
            data, self.held = self.held, data
        write(data)

    def _flush_stream(self, data: bytes, tap: StreamTap) -> None:
        """`on_read` for a stream: one read's bytes, relayed first and parsed after (issue 34).

        The whole events before the first that may be the stream's terminal (`StreamTap.quiet_prefix`)
        go to the client before they are parsed -- or, in the token capture mode, as soon as they
        are cut, the stream's first event on its own (TTFT) -- then the tap takes them in one pass. The rest
        of the read is fed whole; when it completes the terminal event it is held, with what
        follows it, until the line is durable (DESIGN §2).
        """
        if not self.first_written and self.cutter is not None:
            # The token capture mode cuts before it writes: the stream's first event goes out cut
            # before the rest of the read is searched and cut (TTFT). Relayed as it came, a read
            # goes out whole after one search (a write more a stream would cost more than it saves).
            first = data.find(b"\n\n") + 2  # Always an event's end, whatever the line ends.
            if 2 <= first < len(data):
                event = data[:first]
                if tap.quiet_prefix(event) == first:
                    self._write_quiet(event, tap)  # Before the rest is searched: TTFT.
                    data = data[first:]
        quiet = tap.quiet_prefix(data)
        if quiet:
            head = data if quiet == len(data) else data[:quiet]
            self._write_quiet(head, tap)
            if head is data:
                return
            data = data[quiet:]
        ends_reply = tap.feed(data)
        out = tap.take_output() if self.cutter is not None else data
        self._mark_first_content(tap)
        if ends_reply:
            if self.cutter is not None:
                self.held_ready = out  # The terminal event's bytes, and those behind it, already cut.
            else:
                self.held = out
            self._persist_then_flush()
            return
        self.first_written = True
        self.client.write(out)

    def _write_quiet(self, events: bytes, tap: StreamTap) -> None:
        """Whole events that cannot complete the terminal: to the client (cut, in the token
        capture mode), then or meanwhile to the tap."""
        if self.cutter is None:
            self.client.write(events)
            tap.feed(events)  # Cannot complete the terminal event.
        else:
            tap.feed(events)
            self.client.write(tap.take_output())
        self.first_written = True
        self._mark_first_content(tap)

    def _mark_first_content(self, tap: StreamTap) -> None:
        exchange = self.exchange
        if exchange is not None and exchange.latency_ttft_ms is None and tap.has_content:
            exchange.mark_first_content()

    def on_end(self) -> None:
        self.ended = True
        if self.done.done() or self.persisting:
            return  # The persist in flight finishes the reply.
        if self.tap is not None and not self.call.persisted:
            self._persist_then_flush()
            return
        self._flush_and_end()

    def on_error(self, kind: str, exc: BaseException) -> None:
        if self.done.done() or self.broken is not None:
            return
        if kind == "timeout":
            _note_broken(self.exchange, "timeout", exc, "the upstream stopped sending within the read timeout")
            self.broken = "timeout_mid_reply"
        else:
            _note_broken(self.exchange, None, exc, f"the upstream connection failed mid-reply: {exc}")
            self.broken = "reset_mid_reply"
        if not self.persisting:  # Else the persist in flight flushes what is held, then breaks.
            self.held = b""  # A lookahead chunk never completed a reply.
            self._write_cut_tail()  # The part of an event that came, as a direct client sees it.
            self._break()

    def _write_cut(self, data: bytes) -> None:
        """Bytes behind the terminal event, framed and cut by the tap (which folds them no more)."""
        self.tap.feed(data)  # type: ignore[union-attr]
        self.client.write(self.tap.take_output())  # type: ignore[union-attr]

    def _write_cut_tail(self) -> None:
        """End of body: an unterminated last event, cut as if it had ended."""
        if self.cutter is not None:
            self.client.write(self.tap.close_output())  # type: ignore[union-attr]

    def _client_flow(self, paused: bool) -> None:
        if paused:
            self.upstream.pause()
        elif not self.persisting:
            self.upstream.resume()

    def _persist_then_flush(self) -> None:
        self.persisting = True
        if self.remaining is None or self.remaining > 0:
            # More may follow the held chunk (a stream's `[DONE]`, its last frame): bounded by
            # pausing the upstream. A sized body received whole has nothing left to read, and
            # skips the two epoll changes of a pause and resume.
            self.upstream.pause()
        self.call.persist_then(self._after_persist)

    def _after_persist(self) -> None:
        self.persisting = False
        if self.done.done():
            return
        if self.ended and self.broken is None:
            self._flush_and_end()
            return
        # Broken: what arrived before the failure, then the cut.
        self._release_held(tail=self.broken is not None)
        if self.broken is not None:
            self._break()
        elif not self.client.writing_paused:
            self.upstream.resume()

    def _release_held(self, tail: bool, end: bool = False) -> None:
        """What was held back, in one socket write (`Http1Connection.cork`); ``tail``: the cut's
        end of an unterminated last event after it; ``end``: the reply's end too."""
        client = self.client
        client.cork()
        try:
            if self.held_ready:
                client.write(self.held_ready)
                self.held_ready = b""
            if self.held:
                self.write(self.held)
                self.held = b""
            if tail:
                self._write_cut_tail()
            if end:
                client.end()
        finally:
            client.uncork()

    def _flush_and_end(self) -> None:
        self._release_held(tail=True, end=True)
        self._finish("ended")

    def _break(self) -> None:
        self.call.upstream_broke_then(self.broken or "reset_mid_reply", lambda: self._finish("upstream_broke"))

    def _finish(self, outcome: str) -> None:
        self.client.on_write_flow = None
        self.write = _write_nothing  # A bound method of its own: a cycle left to the collector.
        if not self.done.done():
            self.done.set_result(outcome)

    def stop(self) -> None:
        """The handler was cancelled (the client left): stop listening to the upstream."""
        self.client.on_write_flow = None
        self.write = _write_nothing
        if not self.done.done():
            self.done.cancel()


def _write_nothing(data: bytes) -> None:
    pass


def _note_broken(exchange: CallExchange | None, category: str | None, exc: BaseException, message: str) -> None:
    if exchange is None:
        return
    status = exchange.status_code or 0
    if category is None and 200 <= status < 300:
        category = "stream_truncated"
    exchange.category_override = category
    exchange.failure = Failure("stream", category or "upstream_error", message, type(exc).__name__, True)


def _say_uncaptured(sidecar: "Sidecar", route: Route) -> None:
    """A model call without the rollout prefix, with capture on: forwarded, not captured. Said once
    (with the base_url to use), then counted: an agent pointed at the bare URL loses every call."""
    path = route.upstream_target.partition("?")[0]
    if path not in OBSERVED_PATHS:
        return
    sidecar.metrics.uncaptured_calls.inc()
    if "uncaptured" not in sidecar.hinted:
        sidecar.hinted.add("uncaptured")
        log.warning("POST %s came without the /ng-rollout/<rollout_id>/ prefix: forwarded, NOT captured (counted in "
                    "mcc_uncaptured_calls_total from now on); point the agent's base_url at "
                    "%s/ng-rollout/<rollout_id>/v1", path, sidecar.url or "http://<sidecar>",
                    extra={"path": path})


def origin_form(target: str) -> str | None:
    """The path and query of an absolute-form target (``http://host/p?q`` -> ``/p?q``), else None."""
    scheme, separator, rest = target.partition("://")
    if not separator or scheme.lower() not in ("http", "https") or not rest or rest[0] in "/?#":
        return None
    cut = min((at for at in (rest.find("/"), rest.find("?")) if at >= 0), default=-1)
    if cut < 0:
        return "/"
    return rest[cut:] if rest[cut] == "/" else "/" + rest[cut:]


def _certificate_error(exc: BaseException | None) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure ``exc`` is or was raised from, if any."""
    while exc is not None:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _errno_of(exc: BaseException | None) -> int | None:
    """The errno of ``exc`` or of the OS error it was raised from (a refused connect: 111)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc.errno
        exc = exc.__cause__
    return None


def _ignore(_: bool) -> None:
    pass


def _text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None


def _describe_upstream_failure(reply: LocalReply, upstream_url: str, exc: BaseException | None) -> str:
    detail = f"{type(exc).__name__}: {exc}" if exc is not None and str(exc) else type(exc).__name__
    if reply is UPSTREAM_TIMEOUT:
        return f"the upstream model server at {upstream_url} did not answer within the read timeout ({detail})"
    return f"the upstream model server at {upstream_url} could not be reached ({detail})"
