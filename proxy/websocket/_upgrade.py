"""An ``Upgrade: websocket`` request (docs/wire.md): relayed to an upstream that accepts it, else bridged.

Only a prefixed ``/v1/responses`` is served (the Responses WebSocket mode); every other upgrade
gets the 501 the wire gives any upgrade, said once per path. The upstream is asked first, with
the client's own handshake (its key, version and extensions): a ``101`` is relayed as it came and
the socket relayed (`Relay`); any other answer (vLLM: 403 or 404, no WebSocket) and the sidecar
answers the handshake itself and bridges (`Bridge`). An upstream that cannot be reached gets the
HTTP reply an HTTP call would get (502, 504), before any upgrade.
"""

from __future__ import annotations

import logging

from ..call import UPSTREAM_TIMEOUT, UPSTREAM_UNREACHABLE, CallContext, route_request, send_local_reply
from ..http import (ReplyWriter, ServerRequest, UpstreamConnectError, UpstreamProtocolError, UpstreamTimeout,
                    say_refused_upgrade, upstream_request_headers)
from ._bridge import Bridge, switching_protocols_head
from ._metrics import WebSocketMetrics
from ._relay import Relay

log = logging.getLogger("mcc.websocket")

_TEXT = [(b"Content-Type", b"text/plain; charset=utf-8")]


async def serve_websocket(ctx: CallContext, request: ServerRequest, client: ReplyWriter) -> None:
    """Answer one WebSocket upgrade; returns when its socket has closed."""
    target = request.target.decode("latin-1")
    route = route_request("POST", target)  # The path's dialect, as a POST to it would have.
    if route.rollout_id is None or route.dialect != "responses":
        say_refused_upgrade(request.method, request.target, request.value(b"upgrade"))
        client.reply(501, b"Not Implemented", _TEXT, b"only the Responses WebSocket mode is served, on "
                     b"/ng-rollout/<rollout_id>/v1/responses; other protocol upgrades are not supported")
        return
    key, version = request.value(b"sec-websocket-key"), request.value(b"sec-websocket-version")
    if not key or version is None or version.strip() != b"13":
        # RFC 6455 §4.2.2: a version the server does not speak gets 426 naming the one it does.
        client.reply(400 if not key else 426, b"Bad Request" if not key else b"Upgrade Required",
                     [*_TEXT, (b"Sec-WebSocket-Version", b"13")], b"a WebSocket handshake needs Sec-WebSocket-Key "
                     b"and Sec-WebSocket-Version: 13")
        return
    headers = [*upstream_request_headers(request.headers, request.fields), (b"Upgrade", b"websocket"),
               (b"Connection", b"Upgrade")]
    try:
        upstream = await ctx.upstream.upgrade(route.upstream_target.encode("latin-1"), headers)
    except (UpstreamConnectError, UpstreamTimeout, UpstreamProtocolError, OSError) as exc:
        ctx.warnings.warning(("websocket", "upstream"), "a WebSocket for rollout %s: the upstream %s failed before "
                             "answering the upgrade (%s: %s)", route.rollout_id, ctx.upstream_url, type(exc).__name__, exc)
        send_local_reply(client, UPSTREAM_TIMEOUT if isinstance(exc, UpstreamTimeout) else UPSTREAM_UNREACHABLE,
                         "openai", f"the upstream model server at {ctx.upstream_url} could not be reached for the "
                         f"WebSocket ({type(exc).__name__}: {exc})")
        return
    if upstream.tunnel is not None:
        client.connection.transport.write(upstream.raw)  # type: ignore[union-attr]  # The upstream's 101 as it came.
        extensions = next((value for name, value in upstream.headers if name.lower() == b"sec-websocket-extensions"),
                          None)
        ctx.metrics.feature(WebSocketMetrics).websockets.labels("relay").inc()
        await Relay(ctx, request, route.rollout_id, client.connection.take_over(), upstream.tunnel, extensions).run()
        return
    if "websocket bridge" not in ctx.hinted:
        ctx.hinted.add("websocket bridge")
        log.info("the upstream %s answered %d to a WebSocket upgrade on %s: the sidecar serves the Responses "
                 "WebSocket itself, each response.create sent as a streamed POST /v1/responses", ctx.upstream_url,
                 upstream.status, route.upstream_target, extra={"rollout_id": route.rollout_id})
    ctx.metrics.feature(WebSocketMetrics).websockets.labels("bridge").inc()
    client.connection.transport.write(switching_protocols_head(key))  # type: ignore[union-attr]  # the client's transport is open while it upgrades
    await Bridge(ctx, request, route, client.connection.take_over()).run()


__all__ = ["serve_websocket"]
