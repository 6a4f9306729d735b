"""`Sidecar`: the running process's proxy, from one frozen `Settings` (docs/layout.md, docs/configuration.md).

It makes what the calls share -- the `CallContext`: the upstream pool, the journal, the metrics,
the hooks a call gets -- hands ``/-/`` to its admin endpoints (`proxy.app._admin`) and everything
else to `proxy.call.forward`; the capture dir is checked by `proxy.app._capture_dirs`. Start,
drain, close.
Connections are `Http1Connection`s (`proxy.http`: why not aiohttp's server).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from functools import partial
from typing import Any, Awaitable, Optional


from capture.journal import Journal, RepeatLimiter, SegmentPolicy, UploaderProcess, announce_writer
from records.contract import ObjectStore

from ..call import (
    NO_HOOKS,
    CallContext,
    CallHooks,
    RetryMemory,
    Route,
    SidecarMetrics,
    forward,
)
from ..http import KEEPALIVE_IDLE_SECONDS, Http1Connection, ReplyWriter, ServerRequest, UpstreamPool
from ..training import (
    DeclaredWeightVersions,
    PrefixSupply,
    SideCalls,
    TokenCapture,
    TokenModeMetrics,
    TokenTraining,
    WeightVersionHooks,
    probe_engine,
    probe_renderer,
)
from ..privacy import Redaction, RedactionMetrics, load_redaction
from ..websocket import WebSocketMetrics, serve_websocket
from ._admin import AdminEndpoints
from ._in_flight import InFlightPublisher
from ._capture_dirs import prepare_capture_dirs
from ._ended_rollouts import EndedRollouts
from ._settings import Settings
from ._shared_metrics import SNAPSHOT_INTERVAL_S, write_snapshot
from ._upload_metrics import UploadMetrics

log = logging.getLogger("mcc")
#: How long the start waits for the store to take this spool's writer object (never a failed start).
_ANNOUNCE_SECONDS = 5.0

def _say_prefix_supply(supply: PrefixSupply, engine: str, renders: Optional[bool], answered: str) -> None:
    """What the start learnt of prefix supply (docs/tokens.md, "Prefix supply"), kept and said."""
    if engine == "sglang":
        supply.unavailable = "engine_sglang"
        log.info("prefix supply: off: SGLang takes no prompt ids for a chat call; turns go as the agent wrote them "
                 "and each line says why (prefix_not_supplied: engine_sglang)")
    elif renders is False:
        supply.unavailable = "no_renderer"
        log.warning("prefix supply: off: the upstream has no renderer (%s); turns go as the agent wrote them, a turn "
                    "whose text re-tokenizes differently drifts and its rollout is masked (docs/tokens.md, \"Prefix "
                    "supply\")", answered)
    elif renders:
        log.info("prefix supply: on (%s): each chat turn goes on its parent's exact token ids; --no-supply-prefix "
                 "turns it off", answered)
    else:
        log.info("prefix supply: on; whether the upstream renders is learnt at the first turn (%s)", answered)


class Sidecar:
    """One sidecar process's proxy: start it with `start`, stop it with `close`."""

    def __init__(self, settings: Settings, upstream_url: Optional[str] = None) -> None:
        self.settings = settings
        self.metrics = SidecarMetrics()
        for group in (TokenModeMetrics, WebSocketMetrics, UploadMetrics, RedactionMetrics):  # Each feature's, scraped from the start.
            self.metrics.feature(group)
        self.upstream_url = (upstream_url or settings.upstream or "").rstrip("/")
        #: ``model_ref.name`` of every line, worked out once (it parses the upstream URL).
        self.model_ref_name = settings.model_ref_name
        self.journal: Optional[Journal] = None
        #: With a capture store: the spool's sealed segments to the store (docs/files.md).
        self.uploader: Optional[UploaderProcess] = None
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
        #: The token capture mode (docs/tokens.md) and its training-token files (docs/tokens.md): with
        #: capture on, for every call (--capture-tokens) or for Gym's training path (made by `start`).
        self.token_training: Optional[TokenTraining] = None
        #: --redact, --redact-hook, --privacy (docs/privacy.md); None when every line is kept whole.
        self.redaction: Optional[Redaction] = None
        #: The weight version the trainer declared (``/-/weight-version``), shared by --workers.
        self.weight_versions = DeclaredWeightVersions(settings.metrics_dir if settings.worker_index is not None else None)
        self.weight_versions.reread()  # A worker (re)started after a declaration takes it.
        #: The rollouts' ends (``/-/rollouts/<id>/end``), with capture on a capture directory.
        self.ended_rollouts: Optional[EndedRollouts] = None
        #: Side calls (not the policy's turns), marked on their lines; with capture on.
        self.side_calls: Optional[SideCalls] = None
        #: The calls in flight, published for the hand-off's write barrier (capture on a directory).
        self.in_flight: Optional[InFlightPublisher] = None

    @property
    def cut_by_drain(self) -> bool:
        """The drain timeout cut calls still in flight: their lines say so."""
        return self.calls.cut_by_drain

    def _hooks_for(self, route: Route) -> tuple[CallHooks, ...]:
        """The features taking part in a captured call (`CallHooks`): none unless one covers it."""
        hooks: tuple[CallHooks, ...] = NO_HOOKS
        redaction = self.redaction
        if redaction is not None:  # First: every later hook, and the line, see the redacted fields.
            hooks = self.calls.line_hooks
        if self.side_calls is not None:  # Marked before the token capture mode decides to take part.
            hooks += (self.side_calls.hooks(),)
        training = self.token_training
        if training is not None and (training.every_call or route.training_tokens) \
                and (redaction is None or not redaction.metrics_only or redaction.keep_token_ids):
            hooks += (training.hooks(),)
        if self.weight_versions.version is not None:
            hooks += (WeightVersionHooks(self.weight_versions),)
        return hooks

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
        except BaseException:
            self._server.close()
            raise
        await self._choose_engine(settings)
        if self.in_flight is not None:
            self.in_flight.start()
        await self._server.start_serving()
        self._snapshot_metrics()
        port = self._server.sockets[0].getsockname()[1]
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        self.url = self.calls.url = f"http://{host}:{port}"
        return self.url

    async def _choose_engine(self, settings: Settings) -> None:
        """The token capture mode's engine (docs/tokens.md): as set, or with ``--capture-tokens``
        and ``--engine auto``, asked of the upstream (`probe_engine`); and whether prefix supply is
        possible there (`probe_renderer`, asked beside it); both said in the log."""
        training = self.token_training
        if training is None or not self.upstream_url:
            return
        loop = asyncio.get_running_loop()
        supply = training.prefix_supply
        rendering = loop.run_in_executor(None, probe_renderer, self.upstream_url, settings.upstream_ca) \
            if supply is not None else None  # Beside the engine probe: one wait at start, not two.
        engine, why = settings.engine, "--engine"
        if engine == "auto":
            if settings.capture_tokens:
                engine, why = await loop.run_in_executor(None, probe_engine, self.upstream_url, settings.upstream_ca)
            else:
                engine, why = "vllm", ""
        training.mode.engine = engine
        if why:
            log.info("token capture mode: the upstream is %s (%s)", "SGLang" if engine == "sglang" else "vLLM", why,
                     extra={"engine": engine})
        if rendering is not None and supply is not None:
            _say_prefix_supply(supply, engine, *await rendering)
        elif settings.capture_tokens:
            log.info("prefix supply: off (--no-supply-prefix): turns go as the agent wrote them; a turn whose text "
                     "re-tokenizes differently drifts and its rollout is masked (docs/tokens.md, \"Prefix supply\")")

    def _prepare(self, settings: Settings) -> None:
        """What serving needs, once the port is bound: the upstream pool, the capture dirs and the
        journal, the calls' context."""
        self.upstream = UpstreamPool(self.upstream_url, settings.connect_timeout, settings.read_timeout,
                                     settings.upstream_idle_timeout, settings.upstream_ca)
        if settings.capture_on:
            assert settings.capture_dir is not None
            self.admin.capture_dir_was_writable = prepare_capture_dirs(settings)
            token_dir = settings.token_dir or settings.capture_dir
            token_metrics = self.metrics.feature(TokenModeMetrics)
            self.side_calls = SideCalls(settings.policy_model, self.metrics)
            self.token_training = TokenTraining(token_metrics, TokenCapture(token_dir, token_metrics,
                                                                                  settings.capture_routed_experts),
                                                settings.capture_tokens,
                                                PrefixSupply() if settings.supplies_prefix else None, self.side_calls)
            if settings.redact or settings.redact_hook or settings.privacy != "full":
                rules, hook = load_redaction(settings.redact, settings.redact_hook)
                self.redaction = Redaction(self.metrics.feature(RedactionMetrics), rules, hook,
                                           settings.redact_hook_budget, settings.privacy == "metrics-only",
                                           settings.privacy_keep_token_ids,
                                           bytes.fromhex(settings.redact_key) if settings.redact_key
                                           else secrets.token_bytes(32), settings.redact_hook_workers)
            # The token capture mode writes each line's entries with it, on the writer threads.
            segments = None
            if settings.capture_store is not None:  # Writer segments, uploaded (docs/files.md).
                segments = SegmentPolicy(settings.capture_dir, settings.segment_max_bytes, settings.segment_max_age)
                self.uploader = UploaderProcess(settings.capture_dir, settings.capture_store,
                                                token_idle=settings.segment_max_age)
                self.metrics.feature(UploadMetrics).upload_lag = self.uploader.lag
                # Known to every consumer before the first call (capture/journal/_watermark.py).
                problem = announce_writer(settings.capture_dir, settings.capture_store, _ANNOUNCE_SECONDS)
                if problem is not None:
                    log.warning("cannot put this spool's writer object in %s before serving: %s; until its uploader "
                                "reaches the store, a consumer may hand out a rollout ended now without the lines "
                                "of its calls made here", settings.capture_store, problem)
            self.journal = Journal(settings.capture_dir, self.metrics, settings.capture_sync,
                                   process=not settings.capture_tokens, segments=segments)
            if self.uploader is not None:
                self.uploader.start()  # What a restart found sealed in the spool goes first.
            # With a store, ends are its objects; the uploader copies those it sees into the spool.
            self.ended_rollouts = EndedRollouts(settings.capture_dir, settings.token_dir,
                                                ObjectStore(settings.capture_store) if settings.capture_store else None,
                                                self.metrics.registry)
            self.metrics.capture_dir = settings.capture_dir
        self.calls = CallContext(
            upstream=self.upstream, upstream_url=self.upstream_url, metrics=self.metrics, journal=self.journal,
            warnings=self.repeated_warnings, retries=RetryMemory(), model_ref_name=self.model_ref_name,
            max_body_bytes=settings.max_body_bytes,
            correlation_headers=(settings.session_id_header, settings.assistant_message_id_header),
            raw_stream=settings.capture_raw_stream, trace_context=settings.trace_context,
            drain_timeout=settings.drain_timeout, hooks_for=self._hooks_for,
            line_hooks=(self.redaction.hooks(),) if self.redaction is not None else (),
            refusal=self.ended_rollouts.refusal if self.ended_rollouts is not None else lambda route: None,
            forward=settings.forward,
            affinity_header=settings.affinity_header.encode("latin-1") if settings.affinity_header else None)
        if self.ended_rollouts is not None:  # An end waits for its rollout's calls under way here.
            self.ended_rollouts.in_flight = self.calls.rollouts_in_flight
        if settings.capture_on:  # (With a store, in the spool: its uploader holds such rollouts back.)
            assert settings.capture_dir is not None
            self.in_flight = InFlightPublisher(settings.capture_dir, self.calls.rollouts_in_flight)
            if self.ended_rollouts is not None:
                self.ended_rollouts.own_instance = self.in_flight.instance

    def handle(self, request: ServerRequest, client: ReplyWriter) -> Awaitable[None]:
        """The request's handler: an admin endpoint's, else the forwarded call. Returned, not awaited
        here: the connection awaits the call itself (no frame of ours between them on each resume)."""
        if request.target.startswith(b"/-/"):
            return self.admin.serve(request, client)
        if request.upgrade:  # The Responses WebSocket mode (the wire hands over only WebSocket upgrades).
            return serve_websocket(self.calls, request, client)
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
        if self.redaction is not None:  # Lines still being redacted join the journal first (a budget at most).
            await self.redaction.quiet()
        if self.journal is not None:
            await self.journal.close()  # Seals the open segments, with a capture store.
        if self.in_flight is not None:  # Every call is done and its line written.
            self.in_flight.stop()
        if self.uploader is not None:  # Then what it holds goes to the store, within the drain's time.
            await asyncio.get_running_loop().run_in_executor(None, self.uploader.stop, max(5.0, timeout))
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
