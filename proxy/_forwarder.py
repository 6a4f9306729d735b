"""The proxy handler: forward one request upstream and pump the reply back, byte for byte.

The handler only moves bytes and hands a copy of each reply chunk to the tap (DESIGN §2). For a
captured call it holds back exactly one chunk -- the one that completes the terminal event, or
the last chunk of a non-streaming body -- until the call's line is durable: when an agent has
seen the end of a reply, its record is on disk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from capture import BodyTap, StreamTap

from ._exchange import CallExchange, Failure
from ._headers import client_response_headers, single_value, upstream_request_headers
from ._local_replies import (
    BAD_REQUEST_TARGET,
    BODY_TOO_LARGE,
    INVALID_ROLLOUT_ID,
    UPSTREAM_TIMEOUT,
    UPSTREAM_UNREACHABLE,
    LocalReply,
    error_body,
    local_response,
)
from ._metrics import status_class
from ._routing import Route, route_request
from ._state import CAPTURE_WRITER, METRICS, SETTINGS, UPSTREAM_SESSION, UPSTREAM_URL, spawn_background

log = logging.getLogger("mcc.proxy")

# Errors of the upstream connection after its reply started (reset, short body, bad framing).
_UPSTREAM_BODY_ERRORS = (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionError)
# Errors writing to the client: it went away.
_CLIENT_GONE = (ConnectionError, aiohttp.ClientConnectionResetError)


class _BodyTooLarge(Exception):
    pass


class PassThroughResponse(web.StreamResponse):
    """A StreamResponse that adds no ``Date``, ``Server`` or ``Content-Type`` the upstream did not send."""

    _ADDED_BY_AIOHTTP = ("Date", "Server", "Content-Type")

    def __init__(self, status: int, reason: str | None, headers: Any) -> None:
        super().__init__(status=status, reason=reason, headers=headers)
        self._upstream_names = {name.lower() for name in headers}

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        for name in self._ADDED_BY_AIOHTTP:
            if name.lower() not in self._upstream_names:
                self.headers.popall(name, None)


async def forward(request: web.Request) -> web.StreamResponse:
    """Handle any request that is not an admin endpoint."""
    metrics = request.app[METRICS]
    metrics.requests_in_flight.inc()
    route, call, status = None, None, None
    try:
        if not request.raw_path.startswith("/"):
            # An absolute-form target (`GET http://elsewhere/`) would name another host: refused,
            # so only the configured upstream is ever reached.
            response = local_response(BAD_REQUEST_TARGET, "openai",
                                      "the request target must be a path; this sidecar only forwards to its configured upstream")
        else:
            route = route_request(request.method, request.raw_path)
            if route.invalid_rollout_id is not None:
                message = (f"invalid rollout id {route.invalid_rollout_id!r} in the /ng-rollout/ prefix: expected "
                           "1-200 characters of [A-Za-z0-9._-] starting with a letter or digit")
                response = local_response(INVALID_ROLLOUT_ID, route.error_dialect, message)
            else:
                call = _Call(request, route)
                response = await call.run()
        status = response.status
        return response
    finally:
        metrics.requests_in_flight.dec()
        captured = "true" if call is not None and call.exchange is not None else "false"
        dialect = (route.dialect if route is not None else None) or "none"
        metrics.requests.labels(dialect, status_class(status), captured).inc()


class _Call:
    """The state of one forwarded request; `run` is the whole story in one screen."""

    def __init__(self, request: web.Request, route: Route) -> None:
        self.request = request
        self.route = route
        self.app = request.app
        self.settings = request.app[SETTINGS]
        self.writer = request.app[CAPTURE_WRITER]
        self.metrics = request.app[METRICS]
        self.exchange: CallExchange | None = None
        self.persisted = False

    async def run(self) -> web.StreamResponse:
        try:
            body = await self._read_body()
        except _BodyTooLarge:
            self._open_exchange(b"")
            return await self._answer_locally(BODY_TOO_LARGE, "request", None, retryable=False,
                                              message=f"request body exceeds the sidecar's limit of {self.settings.max_body_bytes} bytes")
        self._open_exchange(body)
        try:
            upstream = await self._send_upstream(body)
        except asyncio.CancelledError:
            self._client_gone_before_reply()
            raise
        except (aiohttp.ConnectionTimeoutError, aiohttp.ClientConnectorError) as exc:
            return await self._upstream_failed("connect", UPSTREAM_UNREACHABLE, "upstream_connect", exc)
        except asyncio.TimeoutError as exc:
            return await self._upstream_failed("timeout", UPSTREAM_TIMEOUT, "upstream_response", exc)
        except (aiohttp.ClientError, ConnectionError) as exc:
            return await self._upstream_failed("protocol", UPSTREAM_UNREACHABLE, "upstream_response", exc)
        try:
            return await self._relay(upstream)
        finally:
            upstream.close()  # Not released to the pool mid-body: closing stops the GPU's generation.

    # -- request side ----------------------------------------------------------------------

    async def _read_body(self) -> bytes:
        limit = self.settings.max_body_bytes
        declared = self.request.content_length
        if declared is not None and declared > limit:
            raise _BodyTooLarge
        chunks, size = [], 0
        async for chunk in self.request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise _BodyTooLarge
            chunks.append(chunk)
        return b"".join(chunks)

    def _open_exchange(self, body: bytes) -> None:
        if self.writer is None or self.route.dialect is None:
            return
        headers = self.request.headers
        self.exchange = CallExchange(
            rollout_id=self.route.rollout_id or "",
            dialect=self.route.dialect,
            model_name=self.settings.model_ref_name,
            request_body=body,
            request_encoding=headers.get("Content-Encoding"),
            client_session_id=single_value(headers, self.settings.session_id_header),
            client_assistant_message_id=single_value(headers, self.settings.assistant_message_id_header),
        )

    async def _send_upstream(self, body: bytes) -> aiohttp.ClientResponse:
        url = URL(self.app[UPSTREAM_URL] + self.route.upstream_target, encoded=True)
        if self.exchange is not None:
            self.exchange.start()
        return await self.app[UPSTREAM_SESSION].request(
            self.request.method,
            url,
            headers=upstream_request_headers(self.request.headers),
            data=body if body or self.request.body_exists else None,
            allow_redirects=False,
        )

    # -- reply side ------------------------------------------------------------------------

    async def _relay(self, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        is_stream = upstream.content_type == "text/event-stream"
        if is_stream:
            self.metrics.streams_in_flight.inc()
        try:
            return await self._relay_body(upstream)
        finally:
            if is_stream:
                self.metrics.streams_in_flight.dec()

    async def _relay_body(self, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
        response = PassThroughResponse(upstream.status, upstream.reason, client_response_headers(upstream.raw_headers))
        tap = self._attach_tap(upstream)
        try:
            if isinstance(tap, BodyTap) and upstream.content_length == 0:
                await self._persist_now()  # The headers alone are the whole reply.
            await response.prepare(self.request)
            await self._pump(upstream, response, tap)
        except asyncio.CancelledError:
            self._client_gone(upstream)
            raise
        except _CLIENT_GONE:
            self._client_gone(upstream)
            return response
        except _UpstreamBroke as broke:
            self.metrics.upstream_errors.labels(broke.kind).inc()
            log.warning("upstream %s failed mid-reply (%s) for %s", self.app[UPSTREAM_URL], broke.kind, self.route.upstream_target)
            await self._persist_now()
            _abort(self.request)  # The client sees the failure as it would have directly.
            return response
        await self._persist_holding_back()
        await response.write_eof()
        return response

    def _attach_tap(self, upstream: aiohttp.ClientResponse) -> StreamTap | BodyTap | None:
        if self.exchange is None:
            return None
        self.exchange.status_code = self.exchange.upstream_status_code = upstream.status
        encoding = upstream.headers.get("Content-Encoding")
        if upstream.content_type == "text/event-stream":
            self.exchange.tap = StreamTap(self.exchange.dialect, encoding)
        else:
            self.exchange.tap = BodyTap(self.exchange.dialect, encoding)
        return self.exchange.tap

    async def _pump(self, upstream: aiohttp.ClientResponse, response: web.StreamResponse,
                    tap: StreamTap | BodyTap | None) -> None:
        if tap is None:
            async for chunk in _chunks(upstream, self.exchange):
                await response.write(chunk)
            return
        remaining = None if isinstance(tap, StreamTap) else upstream.content_length
        held = b""  # Lookahead for a body of unknown length: its last chunk is held to the end.
        exchange = self.exchange
        assert exchange is not None
        async for chunk in _chunks(upstream, exchange):
            ends_reply = tap.feed(chunk)
            if exchange.latency_ttft_ms is None and tap.has_content:
                exchange.mark_first_content()
            if remaining is not None:
                remaining -= len(chunk)
                ends_reply = remaining <= 0
            if ends_reply:
                await self._persist_holding_back()
            if isinstance(tap, BodyTap) and remaining is None:
                held, chunk = chunk, held
            if chunk:
                await response.write(chunk)
        if held:
            await self._persist_holding_back()
            await response.write(held)

    # -- outcomes --------------------------------------------------------------------------

    async def _persist_holding_back(self) -> None:
        """Persist while the chunk (or the end of stream) that ends the reply waits (DESIGN §2)."""
        if self.exchange is None or self.persisted:
            return
        started = time.perf_counter()
        await self._persist_now()
        self.metrics.terminal_holdback.observe(time.perf_counter() - started)

    async def _persist_now(self) -> None:
        """Complete the exchange and make its line durable; once per call."""
        if self.exchange is None or self.persisted:
            return
        self.persisted = True
        self._complete(self.exchange)
        await self.writer.persist(self.exchange)  # type: ignore[union-attr]

    def _complete(self, exchange: CallExchange) -> None:
        exchange.complete()
        self.metrics.request_duration.labels(exchange.dialect).observe((exchange.latency_ms or 0) / 1000)
        if exchange.latency_ttft_ms is not None:
            self.metrics.ttft.labels(exchange.dialect).observe(exchange.latency_ttft_ms / 1000)
        tap = exchange.tap
        if (isinstance(tap, StreamTap) and not tap.terminal and exchange.category_override != "cancelled"
                and 200 <= (exchange.status_code or 0) < 300):
            self.metrics.streams_truncated.inc()

    def _client_gone(self, upstream: aiohttp.ClientResponse) -> None:
        upstream.close()
        self._client_gone_before_reply()

    def _client_gone_before_reply(self) -> None:
        self.metrics.client_disconnects.inc()
        if self.exchange is None or self.persisted:
            return
        self.persisted = True
        self.exchange.category_override = "cancelled"
        self.exchange.failure = Failure("client", "cancelled", "the client disconnected before the reply ended")
        self._complete(self.exchange)
        spawn_background(self.app, self.writer.persist(self.exchange))  # type: ignore[union-attr]

    async def _upstream_failed(self, kind: str, reply: LocalReply, stage: str, exc: BaseException) -> web.StreamResponse:
        self.metrics.upstream_errors.labels(kind).inc()
        log.warning("upstream %s failed before replying (%s): %s: %s", self.app[UPSTREAM_URL], kind, type(exc).__name__, exc)
        return await self._answer_locally(reply, stage, exc, retryable=True)

    async def _answer_locally(self, reply: LocalReply, stage: str, exc: BaseException | None,
                              retryable: bool, message: str | None = None) -> web.StreamResponse:
        if message is None:
            message = _describe_upstream_failure(reply, self.app[UPSTREAM_URL], exc)
        if self.exchange is not None:
            failure = Failure(stage, reply.category, message, type(exc).__name__ if exc else None, retryable)
            self.exchange.answer_locally(reply.status, reply.reason, reply.category, failure,
                                         error_body(reply, self.route.error_dialect, message))
            await self._persist_now()
        return local_response(reply, self.route.error_dialect, message)


class _UpstreamBroke(Exception):
    """The upstream failed after its reply started; the exchange already says how."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


async def _chunks(upstream: aiohttp.ClientResponse, exchange: CallExchange | None):  # type: ignore[no-untyped-def]
    """The reply body chunk by chunk as it arrives; upstream failures become `_UpstreamBroke`."""
    content = upstream.content
    while True:
        try:
            chunk, end_of_http_chunk = await content.readchunk()
        except asyncio.TimeoutError as exc:
            _note_broken(exchange, "timeout", exc, "the upstream stopped sending within the read timeout")
            raise _UpstreamBroke("timeout_mid_reply") from exc
        except _UPSTREAM_BODY_ERRORS as exc:
            _note_broken(exchange, None, exc, f"the upstream connection failed mid-reply: {exc}")
            raise _UpstreamBroke("reset_mid_reply") from exc
        if chunk:
            yield chunk
        elif not end_of_http_chunk:
            return


def _note_broken(exchange: CallExchange | None, category: str | None, exc: BaseException, message: str) -> None:
    if exchange is None:
        return
    status = exchange.status_code or 0
    if category is None and 200 <= status < 300:
        category = "stream_truncated"
    exchange.category_override = category
    exchange.failure = Failure("stream", category or "upstream_error", message, type(exc).__name__, True)


def _abort(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


def _describe_upstream_failure(reply: LocalReply, upstream_url: str, exc: BaseException | None) -> str:
    detail = f"{type(exc).__name__}: {exc}" if exc is not None and str(exc) else type(exc).__name__
    if reply is UPSTREAM_TIMEOUT:
        return f"the upstream model server at {upstream_url} did not answer within the read timeout ({detail})"
    return f"the upstream model server at {upstream_url} could not be reached ({detail})"
