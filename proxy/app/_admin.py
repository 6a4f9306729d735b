"""The sidecar's own endpoints under ``/-/`` (docs/wire.md, "The sidecar's own endpoints"):
liveness, readiness ("can forward"), metrics, the declared weight version and the end of a
rollout. A state-changing one needs the admin token when one is set.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional, Protocol

import orjson

from capture.journal import Journal, UploaderProcess
from records.contract import note_declared_version, note_declared_version_in_store

from ..call import CONTENT_TYPE, CallContext, SidecarMetrics, directory_writable
from ..http import ReplyWriter, ServerRequest, UpstreamPool, upstream_problem
from ..training import DeclaredWeightVersions, declared_version
from ._ended_rollouts import EndedRollouts, admin_refusal, end_target
from ._settings import Settings
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
    uploader: Optional[UploaderProcess]
    weight_versions: DeclaredWeightVersions
    ended_rollouts: Optional[EndedRollouts]
    shutting_down: bool


class AdminEndpoints:
    """One sidecar's ``/-/`` endpoints, reading what it serves with."""

    def __init__(self, sidecar: ServedState) -> None:
        self.sidecar = sidecar
        #: Whether the capture dir was writable when last looked at (said once when it stops being).
        self.capture_dir_was_writable = True

    async def serve(self, request: ServerRequest, client: ReplyWriter) -> None:
        """Answer the request to ``/-/...``; a path none of these takes is forwarded as any call."""
        path = request.target.partition(b"?")[0]
        rollout_id = end_target(path)
        if rollout_id is not None:
            status, body = await self.end_rollout(request, rollout_id)
            client.reply(status, _REASONS[status], [(b"Content-Type", b"application/json")], body)
            return
        if path == b"/-/run/end":
            status, body = await self.end_run(request)
            client.reply(status, _REASONS[status], [(b"Content-Type", b"application/json")], body)
            return
        if path == b"/-/weight-version":
            status, body = await self.weight_version(request)
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


    async def weight_version(self, request: ServerRequest) -> tuple[int, bytes]:
        """``GET`` the declared weight version; ``POST {"version": "<label>"}`` declares the one the
        trainer has just loaded (issue 32, `_weight_versions`). Reachable by whatever reaches the
        port, as every admin path: deploy/ says who that is."""
        if request.method in _ADMIN_METHODS:
            return 200, orjson.dumps(self.sidecar.weight_versions.state())
        if request.method != "POST":
            return 405, orjson.dumps({"error": "GET reads the declared weight version; POST {\"version\": \"<label>\"} sets it"})
        refused = self._refusal(request)
        if refused is not None:
            return refused
        version, problem = declared_version(request.body)
        if version is None:
            return 400, orjson.dumps({"error": problem})
        self.sidecar.weight_versions.declare(version)
        if self.sidecar.ended_rollouts is not None:  # The order a consumer counts staleness in (docs/reading.md).
            state = self.sidecar.weight_versions.state()
            try:
                store = self.sidecar.ended_rollouts.store
                if store is not None:
                    await asyncio.get_running_loop().run_in_executor(
                        None, note_declared_version_in_store, store, version, state["declared_at"])
                else:
                    capture_dir = self.sidecar.settings.capture_dir
                    assert capture_dir is not None  # Ends are kept only where calls are captured.
                    await asyncio.get_running_loop().run_in_executor(
                        None, note_declared_version, capture_dir, version, state["declared_at"])
            except Exception as exc:  # A store's refusal too: the declaration itself stands.
                log.warning("cannot note the declared weight version in %s: %s",
                            self.sidecar.settings.capture_store or self.sidecar.settings.capture_dir, exc)
        return 200, orjson.dumps(self.sidecar.weight_versions.state())

    async def end_rollout(self, request: ServerRequest, rollout_id: str) -> tuple[int, bytes]:
        """``POST /-/rollouts/<rollout_id>/end``, body optional: ``{"outcome": {...}, "group":
        "<key>", "group_size": G}``; 200 ``{"rollout_id", "ended_at", "calls"}`` once the end is
        durable (docs/wire.md, "Ending a rollout")."""
        if request.method != "POST":
            return 405, orjson.dumps({"error": "POST ends the rollout, with an optional body: "
                                               '{"outcome": {...}, "group": "<key>", "group_size": G}'})
        refused = self._refusal(request)
        if refused is not None:
            return refused
        if not rollout_id:
            return 400, orjson.dumps({"error": "invalid rollout id: expected 1-200 characters of [A-Za-z0-9._-] "
                                               "starting with a letter or digit"})
        if self.sidecar.ended_rollouts is None:
            return 400, orjson.dumps({"error": "this sidecar captures nothing (no --capture-dir): there is no rollout "
                                               "to end"})
        return await self.sidecar.ended_rollouts.end(rollout_id, request.body)

    def _refusal(self, request: ServerRequest) -> Optional[tuple[int, bytes]]:
        """A state-changing request's refusal unless it carries the admin token (docs/operations.md,
        "Who may change state"): what an agent holds (the port, its headers, a model API key)
        never suffices."""
        settings = self.sidecar.settings
        return admin_refusal(settings.admin_token, settings.open_admin, request.fields.get(b"authorization"))

    async def end_run(self, request: ServerRequest) -> tuple[int, bytes]:
        """``POST /-/run/end``, body optional (any JSON object): the run is over (`records.end_run`);
        200 ``{"ended_at", "info"}`` once durable."""
        if request.method != "POST":
            return 405, orjson.dumps({"error": "POST ends the run (every rollout of it has ended), with an optional "
                                               "JSON object describing it"})
        refused = self._refusal(request)
        if refused is not None:
            return refused
        if self.sidecar.ended_rollouts is None:
            return 400, orjson.dumps({"error": "this sidecar captures nothing (no --capture-dir): there is no run to end"})
        return await self.sidecar.ended_rollouts.end_run(request.body)

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
                          capture="ok" if writable and problem is None else "failing")
            if self.sidecar.uploader is not None:  # Told, never a 503: a store's outage must not fail a call.
                checks.update(capture_store=settings.capture_store, upload_lag=self.sidecar.uploader.lag().as_dict())
                if self.sidecar.uploader.problem is not None:
                    checks["store_problem"] = self.sidecar.uploader.problem
            if problem is not None:  # The last line was refused (a full disk): failing until one is written.
                checks["capture_problem"] = f"the last capture line could not be written: {problem}"
        if self.sidecar.shutting_down:
            checks["status"] = "shutting down"
            return 503, b"application/json", orjson.dumps(checks)
        checks["status"] = "ready" if upstream_ok else "not ready"
        return (200 if upstream_ok else 503), b"application/json", orjson.dumps(checks)


#: The sidecar's own endpoints, as a 404 under ``/-/`` names them.
ADMIN_PATHS = ("GET /-/healthy", "GET /-/ready", "GET /-/metrics", "GET|POST /-/weight-version",
               "POST /-/rollouts/<rollout_id>/end", "POST /-/run/end")

__all__ = ["AdminEndpoints"]
