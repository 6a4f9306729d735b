"""`create_app`: the sidecar as an aiohttp application, from one frozen `Settings` (DESIGN §9)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import AsyncIterator
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from ._capture_writer import CaptureWriter
from ._forwarder import forward
from ._metrics import CONTENT_TYPE, SidecarMetrics
from ._settings import Settings
from ._state import BACKGROUND_TASKS, CAPTURE_WRITER, METRICS, SETTINGS, UPSTREAM_SESSION, UPSTREAM_URL

log = logging.getLogger("mcc")

#: Upstream connections kept open for reuse; vLLM serves hundreds of concurrent streams.
UPSTREAM_CONNECTION_LIMIT = 1024
#: A readiness probe must answer quickly even when the upstream is down.
READY_PROBE_TIMEOUT_S = 2.0


def create_app(settings: Settings, upstream_url: str | None = None) -> web.Application:
    """The sidecar application. ``upstream_url`` overrides ``settings.upstream`` (stand-in mode)."""
    app = web.Application()
    app[SETTINGS] = settings
    app[METRICS] = SidecarMetrics()
    app[UPSTREAM_URL] = (upstream_url or settings.upstream or "").rstrip("/")
    app[BACKGROUND_TASKS] = set()
    app.cleanup_ctx.append(_upstream_session)
    app.cleanup_ctx.append(_capture_writer)
    app.router.add_get("/-/healthy", _healthy)
    app.router.add_get("/-/ready", _ready)
    app.router.add_get("/-/metrics", _metrics)
    # [\s\S], not ".": a percent-encoded newline in the path must reach `forward` (and its 400).
    app.router.add_route("*", r"/{tail:[\s\S]*}", forward)
    return app


async def _upstream_session(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout, sock_read=settings.read_timeout)
    session = aiohttp.ClientSession(
        timeout=timeout,
        connector=aiohttp.TCPConnector(limit=UPSTREAM_CONNECTION_LIMIT, limit_per_host=0, ttl_dns_cache=60),
        auto_decompress=False,  # Bytes are sacred: a gzip body stays gzip (DESIGN §2).
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        trust_env=False,
    )
    app[UPSTREAM_SESSION] = session
    yield
    await session.close()


async def _capture_writer(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    writer = None
    if settings.capture_on:
        assert settings.capture_dir is not None
        try:
            os.makedirs(settings.capture_dir, exist_ok=True)
        except OSError as exc:
            log.error("cannot create capture dir %s: %s; calls are forwarded, capture will fail until it exists",
                      settings.capture_dir, exc)
        writer = CaptureWriter(settings.capture_dir, app[METRICS], settings.capture_sync)
    app[CAPTURE_WRITER] = writer  # type: ignore[assignment]
    yield
    tasks = app[BACKGROUND_TASKS]
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    if writer is not None:
        writer.close()


async def _healthy(request: web.Request) -> web.Response:
    """Liveness: the process is up and serving."""
    return web.json_response({"status": "ok"})


async def _metrics(request: web.Request) -> web.Response:
    """Prometheus text exposition of `SidecarMetrics`."""
    return web.Response(body=request.app[METRICS].exposition(), headers={"Content-Type": CONTENT_TYPE})


async def _ready(request: web.Request) -> web.Response:
    """Readiness: the upstream accepts connections and, with capture on, the capture dir is writable."""
    app = request.app
    settings = app[SETTINGS]
    upstream_ok = await _upstream_reachable(app[UPSTREAM_URL])
    checks: dict[str, object] = {"upstream": app[UPSTREAM_URL], "upstream_reachable": upstream_ok}
    ready = upstream_ok
    if settings.capture_on:
        writable = _directory_writable(settings.capture_dir or "")
        checks.update(capture_dir=settings.capture_dir, capture_dir_writable=writable)
        ready = ready and writable
    checks["status"] = "ready" if ready else "not ready"
    return web.json_response(checks, status=200 if ready else 503)


async def _upstream_reachable(upstream_url: str) -> bool:
    parts = urlsplit(upstream_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), READY_PROBE_TIMEOUT_S)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


def _directory_writable(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)
