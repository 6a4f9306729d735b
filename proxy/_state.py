"""Typed application state (aiohttp ``AppKey``) shared by the sidecar's handlers."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from ._capture_writer import CaptureWriter
from ._metrics import SidecarMetrics
from ._settings import Settings

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", SidecarMetrics)
UPSTREAM_SESSION = web.AppKey("upstream_session", aiohttp.ClientSession)
CAPTURE_WRITER = web.AppKey("capture_writer", CaptureWriter)
#: Capture work that must finish after its client left (a tracked task, never ``shield``).
BACKGROUND_TASKS = web.AppKey("background_tasks", set)
#: The upstream's base URL; a stand-in upstream started in-process sets it at start-up.
UPSTREAM_URL = web.AppKey("upstream_url", str)


def spawn_background(app: web.Application, coroutine: object) -> None:
    """Run ``coroutine`` to completion even if the request that started it is cancelled."""
    task = asyncio.ensure_future(coroutine)  # type: ignore[arg-type]
    tasks: set[asyncio.Future[object]] = app[BACKGROUND_TASKS]
    tasks.add(task)
    task.add_done_callback(tasks.discard)
