"""`Sidecar`: the running process's proxy, from one frozen `Settings` (docs/layout.md, docs/configuration.md).

It makes what the calls share -- the `CallContext`: the upstream pool, the journal, the metrics,
the hooks a call gets -- hands ``/-/`` to its admin endpoints (`proxy.app._admin`) and everything
else to `proxy.call.forward`; the capture dir is checked by `proxy.app._capture_dirs`. Start,
drain, close. Every feature takes part through what it declares (`proxy.app.features`): the
sidecar loops over the feature list and names none.
Connections are `Http1Connection`s (`proxy.http`: why not aiohttp's server).
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any, Awaitable, Optional, TypeVar

from capture.journal import Journal, RepeatLimiter, SegmentPolicy

from ..call import NO_HOOKS, CallContext, CallHooks, LocalReply, RetryMemory, Route, SidecarMetrics, forward
from ..http import KEEPALIVE_IDLE_SECONDS, Http1Connection, ReplyWriter, ServerRequest, UpstreamPool
from ._admin import AdminEndpoints
from ._capture_dirs import prepare_capture_dirs
from ._settings import Settings
from ._shared_metrics import SNAPSHOT_INTERVAL_S, write_snapshot
from .features import FEATURES, Feature

log = logging.getLogger("mcc")
F = TypeVar("F", bound=Feature)


def _overrides(feature: Feature, moment: str) -> bool:
    """Whether ``feature`` takes part in ``moment`` (its class overrides `Feature`'s no-op)."""
    return getattr(type(feature), moment) is not getattr(Feature, moment)


class Sidecar:
    """One sidecar process's proxy: start it with `start`, stop it with `close`."""

    def __init__(self, settings: Settings, upstream_url: Optional[str] = None) -> None:
        self.settings = settings
        self.metrics = SidecarMetrics()
        for feature_class in FEATURES:  # Each feature's metrics, scraped from the start.
            for group in feature_class.metrics:
                self.metrics.feature(group)
        self.upstream_url = (upstream_url or settings.upstream or "").rstrip("/")
        #: ``model_ref.name`` of every line, worked out once (it parses the upstream URL).
        self.model_ref_name = settings.model_ref_name
        self.journal: Optional[Journal] = None
        #: What the features set for the journal in `Feature.prepare` (writer segments; no process).
        self.journal_segments: Optional[SegmentPolicy] = None
        self.connections: set[Http1Connection] = set()
        self._background: set[asyncio.Future[Any]] = set()
        self._server: Optional[asyncio.base_events.Server] = None
        self.upstream: UpstreamPool
        #: What every call may use (made by `start`).
        self.calls: CallContext
        #: Seconds an idle client connection is kept (see `Http1Connection`).
        self.idle_timeout = KEEPALIVE_IDLE_SECONDS
        #: (calls finished, calls cut) by the drain of `close`.
        self.drained = (0, 0)
        #: The endpoints under ``/-/`` (`AdminEndpoints`).
        self.admin = AdminEndpoints(self)
        #: Upstream failures and 413s repeat on every call while they last: said once per 10 s, with a count.
        self.repeated_warnings = RepeatLimiter(logging.getLogger("mcc.proxy"))
        #: The URL this sidecar listens on (set by `start`).
        self.url = ""
        #: Set during --shutdown-delay: still serving, /-/ready says 503.
        self.shutting_down = False
        self._snapshot_timer: Optional[asyncio.TimerHandle] = None
        #: Every feature of the list (`proxy.app.features.FEATURES`), and those these settings turn on,
        #: in the list's order: the order they take part in a call, start and stop.
        self.features: tuple[Feature, ...] = tuple(feature_class(self) for feature_class in FEATURES)
        self.running: tuple[Feature, ...] = tuple(f for f in self.features if type(f).wanted(settings))
        #: The running features' moments a captured call asks for, only of those that take part in
        #: them (a call loops over these: no call on a feature that would answer None).
        self._hook_makers = tuple(f.call_hooks for f in self.running if _overrides(f, "call_hooks"))
        self._refusers = tuple(f.refusal for f in self.running if _overrides(f, "refusal"))

    def feature(self, kind: "type[F]") -> Optional[F]:
        """The running feature of that class, when these settings turn it on."""
        for feature in self.running:
            if type(feature) is kind:
                return feature
        return None

    @property
    def cut_by_drain(self) -> bool:
        """The drain timeout cut calls still in flight: their lines say so."""
        return self.calls.cut_by_drain

    def _hooks_for(self, route: Route) -> tuple[CallHooks, ...]:
        """The features taking part in a captured call (`CallHooks`), in the list's order; none unless one covers it."""
        hooks: tuple[CallHooks, ...] = NO_HOOKS
        for make in self._hook_makers:
            taking_part = make(route)
            if taking_part is not None:
                hooks += (taking_part,)
        return hooks

    def _refusal(self, route: Route) -> Optional[tuple[LocalReply, str]]:
        """A feature's local reply for a captured call that must not go upstream (its rollout ended)."""
        for refusal in self._refusers:
            refused = refusal(route)
            if refused is not None:
                return refused
        return None

    async def start(self) -> str:
        """Bind and serve; returns the URL it listens on. The port is bound first and served only
        once the rest is ready: a port in use fails before anything is made (a capture dir, the
        capture process)."""
        settings = self.settings
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            partial(Http1Connection, self.handle, settings.max_body_bytes, self.connections, self.idle_timeout,
                    settings.head_timeout, settings.max_connections, websocket_upgrades=True),
            settings.host, settings.port, backlog=1024, reuse_port=settings.reuse_port or None, start_serving=False)
        try:
            self._prepare(settings)
            # Every feature's at once: the upstream probes of a start are one wait, not several.
            await asyncio.gather(*(feature.start() for feature in self.running))
        except BaseException:
            self._server.close()
            raise
        await self._server.start_serving()
        self._snapshot_metrics()
        port = self._server.sockets[0].getsockname()[1]
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        self.url = self.calls.url = f"http://{host}:{port}"
        return self.url

    def _prepare(self, settings: Settings) -> None:
        """What serving needs, once the port is bound: the upstream pool, the capture dirs, what
        each feature makes, the journal, the calls' context."""
        self.upstream = UpstreamPool(self.upstream_url, settings.connect_timeout, settings.read_timeout,
                                     settings.upstream_idle_timeout, settings.upstream_ca)
        if settings.capture_on:
            self.admin.capture_dir_was_writable = prepare_capture_dirs(settings)
        for feature in self.running:
            feature.prepare()
        if settings.capture_on:
            self.journal = Journal(settings.capture_dir, self.metrics, settings.capture_sync,
                                   process=True, segments=self.journal_segments)
            self.metrics.capture_dir = settings.capture_dir
        self.calls = CallContext(
            upstream=self.upstream, upstream_url=self.upstream_url, metrics=self.metrics, journal=self.journal,
            warnings=self.repeated_warnings, retries=RetryMemory(), model_ref_name=self.model_ref_name,
            max_body_bytes=settings.max_body_bytes,
            correlation_headers=(settings.session_id_header, settings.assistant_message_id_header),
            raw_stream=settings.capture_raw_stream, trace_context=settings.trace_context,
            drain_timeout=settings.drain_timeout, hooks_for=self._hooks_for,
            line_hooks=tuple(hook for feature in self.running for hook in feature.line_hooks()),
            refusal=self._refusers[0] if len(self._refusers) == 1 else self._refusal, forward=settings.forward,
            affinity_header=settings.affinity_header.encode("latin-1") if settings.affinity_header else None)

    def handle(self, request: ServerRequest, client: ReplyWriter) -> Awaitable[None]:
        """The request's handler: an admin endpoint's, else the forwarded call. Returned, not awaited
        here: the connection awaits the call itself (no frame of ours between them on each resume)."""
        if request.target.startswith(b"/-/"):
            return self.admin.serve(request, client)
        if request.upgrade:  # The wire hands over only WebSocket upgrades: a feature takes them.
            for feature in self.running:
                served = feature.serve_upgrade(request, client)
                if served is not None:
                    return served
        return forward(self.calls, request, client)

    def spawn_background(self, coroutine: Any) -> None:
        """Run ``coroutine`` to completion even if the request that started it is cancelled."""
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self, drain_timeout: Optional[float] = None) -> None:
        """Stop accepting; let in-flight calls finish (up to the drain timeout); write their lines."""
        timeout = self.settings.drain_timeout if drain_timeout is None else drain_timeout
        if self._server is not None:
            self._server.close()
        if self._snapshot_timer is not None:
            self._snapshot_timer.cancel()
        if self.settings.metrics_dir is not None:  # The last counts, for the scrapes still to come.
            try:
                write_snapshot(self.settings.metrics_dir, self.metrics.exposition())
            except OSError:
                pass
        for connection in list(self.connections):
            connection.shut_down()  # Idle ones close now, busy ones after their reply.
        busy_at_start = sum(1 for c in self.connections if c.busy)
        deadline = asyncio.get_running_loop().time() + timeout
        while any(c.busy for c in self.connections) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        in_flight = [c.task for c in self.connections if c.task is not None]
        if in_flight:
            self.calls.cut_by_drain = True
            log.warning("drain timeout (%gs) reached with %d call(s) still in flight: cutting them; each is "
                        "recorded as cancelled with what was relayed so far", timeout, len(in_flight))
        for connection in list(self.connections):
            connection.abort()
        # The cut handlers submit their lines as they unwind: wait for them before the writer closes.
        await asyncio.gather(*in_flight, return_exceptions=True)
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        self.upstream.close()
        for feature in self.running:  # Lines the features still hold join the journal first.
            await feature.drain_lines()
        if self.journal is not None:
            await self.journal.close()  # Seals the open segments, with a capture store.
        for feature in self.running:  # Then what they publish or ship, within the drain's time.
            await feature.stop(timeout)
        if self.settings.metrics_dir is not None:  # And what the drain counted: nothing is lost.
            try:
                write_snapshot(self.settings.metrics_dir, self.metrics.exposition())
            except OSError:
                pass
        self.drained = (busy_at_start - len(in_flight), len(in_flight))
        log.info("drained: %d call%s finished, %d cut; exit 0", busy_at_start - len(in_flight),
                 "" if busy_at_start - len(in_flight) == 1 else "s", len(in_flight))

    def _snapshot_metrics(self) -> None:
        """Refresh this worker's part of the shared metrics, then again in a second."""
        directory = self.settings.metrics_dir
        if directory is None or self._server is None or not self._server.is_serving():
            return
        try:
            write_snapshot(directory, self.metrics.exposition())
        except OSError as exc:
            log.warning("cannot share metrics in %s: %s", directory, exc)
        self._snapshot_timer = asyncio.get_running_loop().call_later(SNAPSHOT_INTERVAL_S, self._snapshot_metrics)
