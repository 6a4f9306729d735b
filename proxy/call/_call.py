"""One model call: forward the request upstream and pump the reply back, byte for byte (docs/wire.md).

`Call.run` is the whole story, as a list of named phases: the request body, the upstream request,
the upstream head, the body (each read: `BodyPump`), the terminal, the line, the end. Features
take part through the hooks chosen for the call (`CallHooks`); the call names none of them.

For a captured call one chunk is held back -- the one that completes the terminal event, or the
last chunk of a non-streaming body -- until the call's line is durable: when an agent has seen the
end of a reply, its record is on disk.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Callable, Optional

from capture import BodyTap, StreamTap, decodable, parse_json_object, reply_expectations
from capture.journal import settles

from ..http import (
    ReplyWriter,
    ServerRequest,
    UpstreamBroke,
    UpstreamConnectError,
    UpstreamProtocolError,
    UpstreamReply,
    UpstreamTimeout,
    WholeBody,
    certificate_problem,
    client_response_headers,
    upstream_request_headers,
)
from ._context import NO_HOOKS, CallContext, CallHooks, phases_of
from ._exchange import CallExchange, Failure
from ._line import submit_line
from ._metrics import SidecarMetrics
from ._overhead import CallOverhead
from ._local_replies import (
    BAD_REQUEST_TARGET,
    NOT_FORWARDED,
    BODY_TOO_LARGE,
    INVALID_ROLLOUT_ID,
    UPSTREAM_TIMEOUT,
    UPSTREAM_UNREACHABLE,
    LocalReply,
    error_body,
    send_local_reply,
)
from ._pump import BodyPump
from ._reply_relay import AS_CAME, ReplyRelay
from ._routing import OBSERVED_PATHS, Route, base_url_mistake, route_request
from ._forwarded_paths import forwards
from ._trace_context import with_trace_context

log = logging.getLogger("mcc.proxy")
access_log = logging.getLogger("mcc.access")
#: With ``--capture-raw-stream on-failure``, the raw text of a stream that parses cleanly is kept
#: only this far back (it is written only if the stream then fails): the last ~200 events of a
#: logprob stream, which is what says how it failed; 1,024 streams x 64-128 KiB (issue 34).
RAW_WINDOW_BYTES = 64 * 1024


async def forward(ctx: CallContext, request: ServerRequest, client: ReplyWriter) -> None:
    """Handle any request that is not an admin endpoint."""
    metrics = ctx.metrics
    metrics.requests_in_flight += 1
    route, call = None, None
    try:
        target = request.target.decode("latin-1")
        if not target.startswith("/"):
            # RFC 9112 §3.2.2: a server MUST accept the absolute-form (`GET http://host/v1/models`).
            # Its path is what is forwarded; its host is not: only the configured upstream is
            # ever reached, whatever the client names.
            target = origin_form(target)  # type: ignore[assignment]  # None is answered just below
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
        if ctx.forward != "all" and not forwards(ctx.forward, route):
            _refuse_unforwarded(ctx, client, route, request.method)
            return
        if route.rollout_id is None and ctx.journal is not None and request.method == "POST":
            _say_uncaptured(ctx, route)
        elif route.rollout_id is not None and ctx.journal is None and "capture off" not in ctx.hinted:
            ctx.hinted.add("capture off")  # Said once: the sidecar was started without a capture dir.
            log.warning("a call for rollout %s came while capture is off: forwarded, NOT captured (start the sidecar "
                        "with --capture-dir DIR, or MCC_CAPTURE_DIR, to record calls)", route.rollout_id,
                        extra={"rollout_id": route.rollout_id})
        call = Call(ctx, request, client, route)
        await call.run()
    finally:
        metrics.requests_in_flight -= 1
        if call is not None:
            _overhead_observed(metrics, call)
        if call is not None and call.exchange is not None:
            _call_ended(ctx.rollouts_in_flight, call.exchange.rollout_id)
        captured = "true" if call is not None and call.exchange is not None else "false"
        dialect = (route.dialect if route is not None else None) or "none"
        status = call.status if call is not None else (BAD_REQUEST_TARGET.status if route is None else INVALID_ROLLOUT_ID.status)
        metrics.request_handled(dialect, status, captured)
        if access_log.isEnabledFor(logging.DEBUG):  # The access log: --log-level debug.
            access_log.debug("%s %s %s captured=%s", request.method, request.target.decode("latin-1"), status, captured,
                             extra={"status": status, "method": request.method,
                                    "rollout_id": route.rollout_id if route is not None else None})


def _overhead_observed(metrics: SidecarMetrics, call: "Call") -> None:
    """The call's parts into ``mcc_call_overhead_seconds`` (a stream's ``first_byte`` from its
    first read to the client's first body bytes)."""
    overhead = call.overhead
    if overhead.first_read_at and call.client.first_body_at >= overhead.first_read_at:
        overhead.first_byte = call.client.first_body_at - overhead.first_read_at
    metrics.call_overhead.observe_each(overhead.parts())


class Call:
    """The state of one forwarded request; `run` is the whole story in one screen."""

    __slots__ = ("ctx", "request", "client", "route", "metrics", "exchange", "hooks", "phases", "persisted", "status",
                 "overhead")

    def __init__(self, ctx: CallContext, request: ServerRequest, client: ReplyWriter, route: Route) -> None:
        self.ctx = ctx
        self.request = request
        self.client = client
        self.route = route
        self.metrics = ctx.metrics
        self.exchange: CallExchange | None = None
        #: The features taking part in this call (none unless it is captured).
        self.hooks: tuple[CallHooks, ...] = NO_HOOKS
        #: The phases those hooks take part in: the others are not run (`CallHooks.phases`).
        self.phases: frozenset[str] = frozenset()
        self.persisted = False
        self.status: Optional[int] = None
        #: The sidecar's own time on this call, by part (docs/speed.md, "Overhead by part").
        self.overhead = CallOverhead()

    async def run(self) -> None:
        if self.request.too_large:
            await self._refuse_too_large()
            return
        self._open_exchange(self.request.body)
        refusal = self._refusal()
        if refusal is not None:  # Answered locally, recorded.
            await self._answer_locally(refusal[0], "request", None, retryable=False, message=refusal[1])
            return
        body = await self._request_body()
        upstream = await self._upstream_head(body)
        if upstream is None:
            return  # Answered locally, recorded.
        try:
            await self._relay(upstream)
        finally:
            upstream.close()  # Back to the pool if the reply ended; closed mid-body, the GPU stops.

    # -- phase: request body -----------------------------------------------------------------

    def _open_exchange(self, body: bytes) -> None:
        ctx = self.ctx
        if ctx.journal is None or self.route.dialect is None:
            return
        exchange = self.exchange = CallExchange(
            rollout_id=self.route.rollout_id or "",
            dialect=self.route.dialect,
            model_name=ctx.model_ref_name,
            request_body=body,
            request_headers=self.request.headers,
            request_fields=self.request.fields,
            correlation_headers=ctx.correlation_headers,
            raw_stream=ctx.raw_stream,
        )
        in_flight = ctx.rollouts_in_flight
        in_flight[exchange.rollout_id] = in_flight.get(exchange.rollout_id, 0) + 1
        if exchange.request_encoding is not None and not decodable(exchange.request_encoding):
            self._undecodable(exchange.request_encoding, "request")
        if body:
            exchange.retries = ctx.retries
            exchange.retry_of = ctx.retries.note(exchange.rollout_id, body, exchange.model_call_id)
        self.hooks = ctx.hooks_for(self.route)
        self.phases = phases_of(self.hooks)

    def _refusal(self) -> Optional[tuple[LocalReply, str]]:
        """The context's refusal of a captured call before it goes upstream (its local reply and
        message); no feature then takes part in it (no intent, no token entry)."""
        if self.exchange is None:
            return None
        refusal = self.ctx.refusal(self.route)
        if refusal is not None:
            self.hooks, self.phases = NO_HOOKS, frozenset()
        return refusal

    async def _request_body(self) -> bytes:
        body = self.request.body
        if "request_body" in self.phases:
            for hook in self.hooks:
                body = await hook.request_body(self, body)
        return body

    # -- phases: upstream request, upstream head -----------------------------------------------

    async def _upstream_head(self, body: bytes) -> Optional[UpstreamReply]:
        """The upstream's reply (its head in), or None once the failure is answered locally."""
        try:
            upstream = await self.send_upstream(body)
            if "upstream_head" in self.phases:
                for hook in self.hooks:
                    upstream = await hook.upstream_head(self, upstream)
            return upstream
        except asyncio.CancelledError:
            self._client_gone_before_reply()
            raise
        except UpstreamConnectError as exc:
            await self._upstream_failed("connect", UPSTREAM_UNREACHABLE, "upstream_connect", exc)
        except UpstreamTimeout as exc:
            await self._upstream_failed("timeout", UPSTREAM_TIMEOUT, "upstream_response", exc)
        except (UpstreamProtocolError, OSError) as exc:
            await self._upstream_failed("protocol", UPSTREAM_UNREACHABLE, "upstream_response", exc)
        return None

    async def send_upstream(self, body: bytes) -> UpstreamReply:
        """Send the request (with ``body``) upstream; a hook may send it again (`upstream_head`)."""
        request, exchange = self.request, self.exchange
        headers = upstream_request_headers(request.headers, request.fields)
        if exchange is not None:
            exchange.start()
            if self.ctx.trace_context:
                headers = with_trace_context(headers, exchange.rollout_id, exchange.model_call_id, request.fields)
            affinity = self.ctx.affinity_header
            if affinity is not None and exchange.rollout_id and affinity.lower() not in request.fields:
                headers = [*headers, (affinity, exchange.rollout_id.encode("latin-1"))]
            if "upstream_request" in self.phases:
                for hook in self.hooks:
                    headers = hook.upstream_request(self, headers)
        overhead = self.overhead
        if overhead.request is None:  # A hook's second send (the agent's own request after a refusal) is the upstream's.
            overhead.request = time.perf_counter() - overhead.started
        reply = await self.ctx.upstream.request(request.method, self.route.upstream_target.encode("latin-1"),
                                                headers, body, request.has_body)
        overhead.connect = reply.connect_seconds
        overhead.head_at = time.perf_counter()
        return reply

    # -- phase: the body, each read -------------------------------------------------------------

    async def _relay(self, upstream: UpstreamReply) -> None:
        is_stream = upstream.fields.get(b"content-type", b"").split(b";")[0].strip().lower() == b"text/event-stream"
        if is_stream:
            self.metrics.streams_in_flight += 1
        try:
            await self._relay_body(upstream, is_stream)
        finally:
            if is_stream:
                self.metrics.streams_in_flight -= 1
            if "reply_done" in self.phases:
                for hook in self.hooks:
                    hook.reply_done(self)

    async def _relay_body(self, upstream: UpstreamReply, is_stream: bool) -> None:
        self.status = upstream.status
        if upstream.status == 404:
            self._hint_base_url()
        relay = self._chosen_relay(upstream)
        tap = self._attach_tap(upstream, is_stream, relay)
        if relay.rewrites and (not is_stream or upstream.content_length is not None):
            await self._relay_rewritten_body(upstream, tap, relay)  # A sized body: its length changes.
            return
        if isinstance(tap, BodyTap) and upstream.content_length == 0:
            await self._persist_now()  # The headers alone are the whole reply.
        await self._before_reply_bytes()  # Bytes may reach the agent before the line.
        self.client.start(upstream.status, upstream.reason, client_response_headers(upstream.headers, upstream.fields),
                          upstream.chunked)
        self.overhead.head = time.perf_counter() - self.overhead.head_at
        pump = BodyPump(self, upstream, tap, relay)  # Delivers the body bytes that came with the head.
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
            self.client.connection.abort()  # The client sees the failure as it would have directly.

    def _chosen_relay(self, upstream: UpstreamReply) -> ReplyRelay:
        """The first relay a hook chooses for the reply (`CallHooks.reply_relay`), else `AS_CAME`."""
        if "reply_relay" not in self.phases:
            return AS_CAME
        for hook in self.hooks:
            relay = hook.reply_relay(self, upstream)
            if relay is not None:
                return relay
        return AS_CAME

    async def _before_reply_bytes(self) -> None:
        if "before_reply_bytes" in self.phases:
            for hook in self.hooks:
                await hook.before_reply_bytes(self)

    async def _relay_rewritten_body(self, upstream: UpstreamReply, tap: StreamTap | BodyTap | None,
                                    relay: ReplyRelay) -> None:
        """A sized body a relay rewrites: read whole, rewritten whole, its Content-Length recomputed
        (docs/tokens.md). A JSON body's line is durable before the agent gets a byte of it; a sized
        stream's events go out as soon as the whole is rewritten, the one that completes the reply and
        what follows it once the line is durable (issue 55)."""
        sink = WholeBody()
        upstream.attach(sink)
        try:
            body = await sink.done
        except UpstreamBroke as broke:  # As a direct call would: what came, then the break.
            if tap is not None:
                tap.feed(broke.partial)
            await self._before_reply_bytes()
            self.client.start(upstream.status, upstream.reason, client_response_headers(upstream.headers, upstream.fields),
                              upstream.chunked)
            self.client.write(broke.partial)
            self.upstream_broke_then(broke.kind, self.client.connection.abort)
            return
        except asyncio.CancelledError:
            self._client_gone_before_reply()
            raise
        first, rest = relay.whole(tap, body)  # A stream's events before the one that completes it, the rest.
        if tap is not None and self.exchange is not None:
            self.exchange.mark_first_content()
        headers = client_response_headers(upstream.headers, upstream.fields)
        if upstream.content_length is not None:
            length = str(len(first) + len(rest)).encode()
            headers = [(name, length if name.lower() == b"content-length" else value) for name, value in headers]
        if first:
            await self._before_reply_bytes()  # Bytes reach the agent before the line.
            self.client.start(upstream.status, upstream.reason, headers, upstream.chunked)
            self.client.write(first)
        await self._persist_now()
        if not first:
            self.client.start(upstream.status, upstream.reason, headers, upstream.chunked)
        self.client.write(rest)
        self.client.end()

    def _attach_tap(self, upstream: UpstreamReply, is_stream: bool, relay: ReplyRelay) -> StreamTap | BodyTap | None:
        exchange = self.exchange
        if exchange is None:
            return None
        exchange.status_code = exchange.upstream_status_code = upstream.status
        coding = upstream.fields.get(b"content-encoding")
        encoding = coding.decode("latin-1") if coding is not None else None
        if encoding is not None and not decodable(encoding):
            self._undecodable(encoding, "reply")
        if is_stream:
            # The line is all that reads the reassembly: per-token lists stay JSON (memory, issue 20).
            window = RAW_WINDOW_BYTES if self.ctx.raw_stream == "on-failure" else None
            # Where the request says so, the reply ends at its last meaningful event (docs/wire.md;
            # a compressed request body says nothing: its reply ends at its terminal, as ever).
            expect = reply_expectations(exchange.dialect, exchange.request_body, exchange.parsed_request)
            exchange.tap = relay.stream_tap(exchange.dialect, encoding, compact_arrays=True, raw_window=window,
                                            expect=expect, unasked_usage=self.ctx.unasked_usage)
        else:
            exchange.tap = BodyTap(exchange.dialect, encoding)
        return exchange.tap

    # -- phases: terminal, line, end ----------------------------------------------------------

    def persist_then(self, then: Callable[[], None], holding_back: bool = True) -> None:
        """Complete the exchange and make its line durable, then call ``then()`` (on the loop).

        The pump's form of `_persist_now`: no task, no future. With ``holding_back`` the wait is
        measured as the terminal chunk's hold-back (docs/wire.md).
        """
        if holding_back:
            started, metrics = time.perf_counter(), self.metrics

            def settled(_: bool) -> None:
                metrics.terminal_holdback.observe(time.perf_counter() - started)
                then()
            self._line_then(settled)
        else:
            self._line_then(lambda _: then())

    def _line_then(self, settled: Callable[[bool], None]) -> None:
        """The terminal and the line, once per call; ``settled(written)`` after (at once when
        there is no line to write)."""
        exchange = self.exchange
        if exchange is None or self.persisted:
            settled(True)
            return
        self.persisted = True
        self._terminal(exchange)
        submit_line(self.ctx.journal, exchange, self.hooks, settled, self.overhead)  # type: ignore[arg-type]  # persisted only with a journal

    async def _persist_now(self) -> None:
        """Complete the exchange and make its line durable; once per call. What the agent has not
        had of the reply waits meanwhile: measured as the hold-back, as the pump's is."""
        if self.exchange is None or self.persisted:
            return
        started = time.perf_counter()
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._line_then(settles(future))
        written = await asyncio.shield(future)  # A cancelled handler still lets the line be written.
        self.metrics.terminal_holdback.observe(time.perf_counter() - started)
        if not written:
            await self._before_reply_bytes()  # The line's barrier, which was to cover it, failed.

    def _terminal(self, exchange: CallExchange) -> None:
        """The upstream exchange ended: its times, and the hooks told."""
        exchange.complete()
        if "terminal" in self.phases:
            for hook in self.hooks:
                hook.terminal(self)
        metrics = self.metrics
        ttft = exchange.latency_ttft_ms
        metrics.exchange_timed(exchange.dialect, (exchange.latency_ms or 0) / 1000, ttft / 1000 if ttft is not None else None)
        tap = exchange.tap
        if (isinstance(tap, StreamTap) and not tap.terminal and exchange.category_override != "cancelled"
                and 200 <= (exchange.status_code or 0) < 300):
            metrics.streams_truncated.inc()
        if isinstance(tap, StreamTap) and self.ctx.unasked_usage is None:
            # The first whole stream that asked no usage says whether this upstream adds it anyway:
            # from then on such a reply ends at its last finish reason, or at that usage chunk.
            self.ctx.unasked_usage = tap.unasked_usage_seen

    def note_after_end(self, data: bytes) -> None:
        """Bytes of the reply relayed after its line was made. A reply that asked no usage was
        ended at its last finish reason (this upstream added none so far); a usage chunk after it
        means the upstream does now (a restart with ``--enable-force-include-usage``, another
        server behind a router): later replies wait for it. This one's line has no usage: said."""
        if self.ctx.unasked_usage is False and b'"usage":{' in data and self.exchange is not None:
            self.ctx.unasked_usage = True
            self.ctx.warnings.warning(("unasked usage",), "the upstream sent a usage chunk that the request did not ask "
                                      "for after the last finish reason, where it sent none before: rollout %s's line "
                                      "has no usage; later replies wait for it", self.exchange.rollout_id)

    def _undecodable(self, encoding: str, body: str) -> None:
        """A body in an encoding nobody decodes: forwarded as it came, its bytes kept base64 on
        the line, counted, and said (then counted in the log as it repeats)."""
        name = encoding.strip().lower()
        self.metrics.undecodable_bodies.labels(name if len(name) <= 32 else "other").inc()
        self.ctx.warnings.warning(("encoding", name), "cannot decode Content-Encoding %r of a %s body: forwarded as "
                                  "it came, its line keeps the bytes base64 (the capture decodes gzip, deflate, br, "
                                  "zstd)", encoding, body)

    def _client_gone_before_reply(self) -> None:
        exchange = self.exchange
        tap = exchange.tap if exchange is not None else None
        if exchange is None or self.persisted:
            # A reply whose line was made at its last meaningful event (docs/wire.md): the client
            # left before what follows it (`[DONE]`), having had all of it.
            whole = isinstance(tap, StreamTap) and tap.terminal and exchange.category_override is None  # type: ignore[union-attr]  # the exchange is checked on the line above
            (self.metrics.left_after_end if whole else self.metrics.client_disconnects).inc()
            return
        if (isinstance(tap, StreamTap) and not self.ctx.cut_by_drain
                and tap.seen_whole(exchange.parsed_request if exchange.parsed_request is not None
                                   else parse_json_object(exchange.request_body))):
            # Every choice had its finish reason (and the usage chunk asked for): the client left
            # before [DONE] only, having had the whole reply (docs/wire.md). Complete, not a cancel.
            tap.end_seen_whole()
            self.metrics.left_after_end.inc()
            self._line_then(_ignore)
            return
        self.metrics.client_disconnects.inc()
        exchange.category_override = "cancelled"
        if self.ctx.cut_by_drain:
            exchange.failure = Failure("client", "cancelled", "the sidecar was shutting down and its drain timeout "
                                       f"({self.ctx.drain_timeout:g}s) ended before the reply did", None, True)
        else:
            exchange.failure = Failure("client", "cancelled", "the client disconnected before the reply ended")
        # Written even though nobody waits: closing the journal (shutdown) writes what is queued.
        self._line_then(_ignore)

    # -- outcomes -----------------------------------------------------------------------------

    def upstream_broke_then(self, kind: str, then: Callable[[], None]) -> None:
        self.metrics.upstream_errors.labels(kind).inc()
        self.ctx.warnings.warning(("mid-reply", kind), "upstream %s failed mid-reply (%s) for %s", self.ctx.upstream_url,
                                  kind, self.route.upstream_target, extra=self.log_context())
        self.persist_then(then, holding_back=False)

    async def _upstream_failed(self, kind: str, reply: LocalReply, stage: str, exc: BaseException) -> None:
        if "upstream_failed" in self.phases:
            for hook in self.hooks:
                await hook.upstream_failed(self)
        self.metrics.upstream_errors.labels(kind).inc()
        certificate = _certificate_error(exc)
        if certificate is not None:
            # Not retryable: every call fails the same way until the sidecar is given the CA.
            message = f"the upstream model server at {self.ctx.upstream_url}: {certificate_problem(certificate)}"
            self.ctx.warnings.warning(("before-reply", "tls"), "%s", message,
                                      extra={**self.log_context(), "status": reply.status})
            await self._answer_locally(reply, stage, certificate, retryable=False, message=message)
            return
        self.ctx.warnings.warning(("before-reply", kind), "upstream %s failed before replying (%s): %s: %s",
                                  self.ctx.upstream_url, kind, type(exc).__name__, exc,
                                  extra={**self.log_context(), "status": reply.status, "errno": _errno_of(exc)})
        await self._answer_locally(reply, stage, exc, retryable=True)

    async def _refuse_too_large(self) -> None:
        limit = self.ctx.max_body_bytes
        self.ctx.warnings.warning("413", "refused a request body over the limit of %d bytes (413) for %s", limit,
                                  self.route.upstream_target, extra={**self.log_context(), "status": 413})
        self._open_exchange(b"")
        await self._answer_locally(BODY_TOO_LARGE, "request", None, retryable=False,
                                   message=f"request body exceeds the sidecar's limit of {limit} bytes")

    async def _answer_locally(self, reply: LocalReply, stage: str, exc: BaseException | None,
                              retryable: bool, message: str | None = None) -> None:
        if message is None:
            message = _describe_upstream_failure(reply, self.ctx.upstream_url, exc)
        self.status = reply.status
        if self.exchange is not None:
            failure = Failure(stage, reply.category, message, type(exc).__name__ if exc else None, retryable)
            self.exchange.answer_locally(reply.status, reply.reason, reply.category, failure,
                                         error_body(reply, self.route.error_dialect, message))
            await self._persist_now()
        send_local_reply(self.client, reply, self.route.error_dialect, message)

    def _hint_base_url(self) -> None:
        mistake = base_url_mistake(self.route.upstream_target)
        if mistake is not None and mistake not in self.ctx.hinted:  # Said once per sidecar and kind.
            self.ctx.hinted.add(mistake)
            log.warning("the upstream answered 404 for %s (forwarded unchanged): %s", self.route.upstream_target,
                        mistake, extra={**self.log_context(), "status": 404})

    def log_context(self) -> dict[str, object]:
        return {"rollout_id": self.route.rollout_id, "upstream": self.ctx.upstream_url,
                "path": self.route.upstream_target, "method": self.request.method}


def _ignore(_: bool) -> None:
    pass


def _call_ended(in_flight: dict[str, int], rollout_id: str) -> None:
    left = in_flight.get(rollout_id, 1) - 1
    if left > 0:
        in_flight[rollout_id] = left
    else:
        in_flight.pop(rollout_id, None)


def _refuse_unforwarded(ctx: CallContext, client: ReplyWriter, route: Route, method: str) -> None:
    """A path outside the model API under ``--forward model-api``: 404 here, said in the log (once
    per path), never upstream."""
    path = route.upstream_target.partition("?")[0]
    if len(ctx.hinted) < 10_000 and f"unforwarded {path}" not in ctx.hinted:
        ctx.hinted.add(f"unforwarded {path}")
        log.warning("%s %s answered 404, not forwarded: --forward model-api (MCC_FORWARD) forwards the model API "
                    "only; --forward all forwards every path", method, path[:200], extra={"path": path[:200]})
    send_local_reply(client, NOT_FORWARDED, route.error_dialect,
                     f"{path[:200]} is not forwarded by this sidecar (--forward model-api): it serves the model API only")


def _say_uncaptured(ctx: CallContext, route: Route) -> None:
    """A model call without the rollout prefix, with capture on: forwarded, not captured. Said once
    (with the base_url to use), then counted: an agent pointed at the bare URL loses every call."""
    path = route.upstream_target.partition("?")[0]
    if path not in OBSERVED_PATHS:
        return
    ctx.metrics.uncaptured_calls.inc()
    if "uncaptured" not in ctx.hinted:
        ctx.hinted.add("uncaptured")
        log.warning("POST %s came without the /ng-rollout/<rollout_id>/ prefix: forwarded, NOT captured (counted in "
                    "mcc_uncaptured_calls_total from now on); point the agent's base_url at "
                    "%s/ng-rollout/<rollout_id>/v1", path, ctx.url or "http://<sidecar>",
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


def _describe_upstream_failure(reply: LocalReply, upstream_url: str, exc: BaseException | None) -> str:
    detail = f"{type(exc).__name__}: {exc}" if exc is not None and str(exc) else type(exc).__name__
    if reply is UPSTREAM_TIMEOUT:
        return f"the upstream model server at {upstream_url} did not answer within the read timeout ({detail})"
    return f"the upstream model server at {upstream_url} could not be reached ({detail})"


__all__ = ["Call", "forward", "origin_form"]
