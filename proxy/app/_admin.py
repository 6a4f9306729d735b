"""The sidecar's own endpoints under ``/-/`` (docs/wire.md, "The sidecar's own endpoints"):
liveness, readiness ("can forward"), metrics, and those the features declare (the declared weight
version, the end of a rollout, the run's end: `proxy.app.features`). A state-changing one needs
the admin token (`proxy.app.features.AdminAccessFeature`).
"""

from __future__ import annotations

import logging
from typing import Optional, Protocol

import orjson

from capture import per_event_core
from capture.journal import Journal

from ..call import CONTENT_TYPE, CallContext, SidecarMetrics, directory_writable
from ..http import ReplyWriter, ServerRequest, UpstreamPool, upstream_problem
from ._settings import Settings
from .features import FEATURES, Feature
from ._shared_metrics import merged_exposition, write_snapshot

log = logging.getLogger("mcc")

#: A readiness probe must answer quickly even when the upstream is down.
_ADMIN_METHODS = ("GET", "HEAD")
_REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden", 404: b"Not Found", 405: b"Method Not Allowed", 409: b"Conflict",
            501: b"Not Implemented", 503: b"Service Unavailable"}


class ServedState(Protocol):
    """What the endpoints read of the sidecar (`proxy.app.Sidecar`)."""

    settings: Settings
    metrics: SidecarMetrics
    calls: CallContext
    upstream_url: str
    upstream: UpstreamPool
    journal: Optional[Journal]
    shutting_down: bool
    #: Every feature, and those running (`proxy.app.Sidecar`).
    features: tuple[Feature, ...]
    running: tuple[Feature, ...]


class AdminEndpoints:
    """One sidecar's ``/-/`` endpoints, reading what it serves with."""

    def __init__(self, sidecar: ServedState) -> None:
        self.sidecar = sidecar
        #: Whether the capture dir was writable when last looked at (said once when it stops being).
        self.capture_dir_was_writable = True

    async def serve(self, request: ServerRequest, client: ReplyWriter) -> None:
        """Answer the request to ``/-/...``; a path none of these takes is forwarded as any call."""
        path = request.target.partition(b"?")[0]
        for feature in self.sidecar.features:  # A feature's answers even when it is off (it says why).
            for start, _ in type(feature).admin_paths:
                if path == start.encode() or (start.endswith("/") and path.startswith(start.encode())):
                    answer = await feature.serve_admin(path, request)
                    if answer is not None:
                        status, body = answer
                        client.reply(status, _REASONS[status], [(b"Content-Type", b"application/json")],
                                     b"" if request.method == "HEAD" else body)
                        return
        admin = {b"/-/healthy": self.healthy, b"/-/health": self.healthy, b"/-/ready": self.ready,
                 b"/-/metrics": self.metrics}.get(path)  # /-/health: what people type for /-/healthy.
        if admin is not None and request.method in _ADMIN_METHODS:
            status, content_type, body = await admin()
            client.reply(status, b"OK" if status == 200 else b"Service Unavailable",
                         [(b"Content-Type", content_type)], b"" if request.method == "HEAD" else body)
            return
        # ``/-/`` is the sidecar's own, never forwarded (docs/wire.md): a path that is not one of its
        # endpoints (a typo: /-/rollout/x/end) or a method it does not take says what there is.
        status = 405 if admin is not None else 404
        client.reply(status, _REASONS[status], [(b"Content-Type", b"application/json")], orjson.dumps({
            "error": f"{request.method} {path.decode('latin-1')} is not an endpoint of this sidecar; /-/ is its own "
                     "and is never forwarded. Its endpoints: " + ", ".join(ADMIN_PATHS),
            "paths": list(ADMIN_PATHS)}))


    async def healthy(self) -> tuple[int, bytes, bytes]:
        """Liveness: the process is up and serving."""
        return 200, b"application/json", orjson.dumps({"status": "ok"})

    async def metrics(self) -> tuple[int, bytes, bytes]:
        """Prometheus text exposition of `SidecarMetrics`; with ``--workers``, summed over every worker."""
        directory = self.sidecar.settings.metrics_dir
        if directory is None:
            return 200, CONTENT_TYPE.encode(), self.sidecar.metrics.exposition()
        write_snapshot(directory, self.sidecar.metrics.exposition())
        return 200, CONTENT_TYPE.encode(), merged_exposition(directory)

    async def ready(self) -> tuple[int, bytes, bytes]:
        """Readiness means "can forward": the upstream accepts connections.

        Capture health is reported in the body (and `mcc_capture_dir_writable`, and the log), never
        in the status: a 503 takes the pod out of its Service, and every model call would fail
        for a capture fault, which must never hurt a call (docs/guarantees.md).
        """
        settings = self.sidecar.settings
        problem = await upstream_problem(self.sidecar.upstream_url, self.sidecar.upstream.ssl)
        upstream_ok = problem is None
        checks: dict[str, object] = {"upstream": self.sidecar.upstream_url, "upstream_reachable": upstream_ok}
        if problem is not None:
            checks["upstream_problem"] = problem
        if settings.capture_on:
            writable = directory_writable(settings.capture_dir or "")
            if not writable and self.capture_dir_was_writable:
                log.warning("capture dir %s is not writable: calls are forwarded, their lines are lost until it is",
                            settings.capture_dir)
            self.capture_dir_was_writable = writable
            problem = self.sidecar.journal.write_problem if self.sidecar.journal is not None else None
            checks.update(capture_dir=settings.capture_dir, capture_dir_writable=writable,
                          capture="ok" if writable and problem is None else "failing", per_event_core=per_event_core())
            for feature in self.sidecar.running:  # Told, never a 503: a store's outage must not fail a call.
                checks.update(feature.ready())
            if problem is not None:  # The last line was refused (a full disk): failing until one is written.
                checks["capture_problem"] = f"the last capture line could not be written: {problem}"
        if self.sidecar.shutting_down:
            checks["status"] = "shutting down"
            return 503, b"application/json", orjson.dumps(checks)
        checks["status"] = "ready" if upstream_ok else "not ready"
        return (200 if upstream_ok else 503), b"application/json", orjson.dumps(checks)


#: The sidecar's own endpoints, as a 404 under ``/-/`` names them: its own, then the features'.
ADMIN_PATHS = ("GET /-/healthy", "GET /-/ready", "GET /-/metrics") + tuple(
    said for feature in FEATURES for _, said in feature.admin_paths)

__all__ = ["AdminEndpoints"]
