"""Serving the sidecar on a real socket: start it, `mcc serve`'s lifecycle (ready line, signals, drain)."""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import signal
import socket
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, Protocol
from urllib.parse import urlsplit

import orjson

from capture import per_event_core

from ._sidecar import Sidecar
from ._logging import utc_timestamp
from ._settings import Settings

log = logging.getLogger("mcc")


class RunningServer(Protocol):
    """A started server and the URL it listens on."""

    url: str

    async def close(self) -> None: ...


@dataclass
class SidecarServer:
    """A started `Sidecar` and its URL; `close` drains in-flight calls first."""

    sidecar: Sidecar
    url: str

    async def close(self) -> None:
        await self.sidecar.close()


async def start_sidecar(settings: Settings, upstream_url: str | None = None) -> SidecarServer:
    sidecar = Sidecar(settings, upstream_url)
    return SidecarServer(sidecar, await sidecar.start())


async def _warn_if_the_upstream_does_not_resolve(upstream: str | None) -> None:
    """A WARNING, not an exit: the model server's name may resolve later (a Service whose pods are
    not up yet); every call gets a clear 502 until it does, and readiness says 503."""
    host = urlsplit(upstream or "").hostname
    if not host:
        return
    try:
        await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo(host, None), 5)
    except (OSError, asyncio.TimeoutError) as exc:
        log.warning("the upstream host %r does not resolve (%s): calls get a 502 and /-/ready says 503 until it "
                    "does; check --upstream / MCC_UPSTREAM", host, getattr(exc, "strerror", None) or type(exc).__name__,
                    extra={"upstream": upstream})


class CannotServe(Exception):
    """The sidecar cannot listen where it was told to (port in use, unknown host): one sentence."""


async def serve_forever(settings: Settings, log_format: str = "text",
                        start_stand_in: Optional[Callable[[], Awaitable[RunningServer]]] = None) -> None:
    """`mcc serve`: start, print the ready line, run until SIGINT / SIGTERM, then drain.

    ``start_stand_in``: with ``--stand-in``, how to start the stand-in model server the sidecar
    forwards to (the CLI gives `proxy.standin.start_stand_in`: the app never imports it).
    """
    # The handlers go in first: the listener is open (and the metrics snapshot written) before the
    # ready line, and a SIGTERM from then on must drain, never kill (a supervisor stopping a
    # worker it has just restarted, a rolling update right after a start).
    stop = stop_on_sigint_or_sigterm()
    started: list[Any] = []
    if settings.worker_index is not None:
        # Another worker declared a weight version: the supervisor signals every worker, and each
        # feature reads again what the workers share (`Feature.reread`). Handled from the start, so a
        # signal never kills a worker still starting.
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGUSR1, lambda: started and [feature.reread() for feature in started[0].sidecar.running])
    stand_in = await start_stand_in() if settings.stand_in and start_stand_in is not None else None
    try:
        sidecar = await start_sidecar(settings, stand_in.url if stand_in else None)
        started.append(sidecar)
    except OSError as exc:
        if stand_in is not None:
            await stand_in.close()
        raise CannotServe(_why_not_listening(settings, exc)) from None
    if stand_in is not None:
        log.info("stand-in model server at %s", stand_in.url)
    else:
        await _warn_if_the_upstream_does_not_resolve(settings.upstream)
    startup = describe_startup(settings, stand_in.url if stand_in else settings.upstream)
    if settings.worker_index is not None:  # The log line's prefix names the worker.
        startup = f"pid {os.getpid()}: {startup}"
    log.info("%s", startup)
    if settings.worker_index in (None, 0):  # Once, once it listens (by the first worker).
        if settings.open_admin and settings.host not in ("127.0.0.1", "::1", "localhost"):
            log.warning("listening on %s with --open-admin: whatever reaches the port (an agent too) may end "
                        "rollouts with any outcome and declare weight versions", settings.host)
        elif settings.admin_token is None and not settings.open_admin and settings.capture_on:
            log.info("no admin token (MCC_ADMIN_TOKEN or --admin-token-file): ending rollouts over HTTP is refused; "
                     "end them with records.end_rollout on the capture directory, or set a token for the runner")
    freeze_startup_objects()
    print(ready_line(sidecar.url, log_format), flush=True)
    await stop.wait()
    if settings.shutdown_delay > 0:
        # A rolling update: the endpoint is being removed, but calls may still be routed here for
        # a moment. Keep serving them, and say "not ready" so no new route is made to us. A second
        # SIGTERM or Ctrl-C means "now": the delay is cut and the drain begins.
        sidecar.sidecar.shutting_down = True
        stop.clear()
        log.info("SIGTERM: still accepting for %gs while /-/ready says 503 (--shutdown-delay), then draining; "
                 "a second SIGTERM or Ctrl-C drains now", settings.shutdown_delay)
        try:
            await asyncio.wait_for(stop.wait(), timeout=settings.shutdown_delay)
            log.info("a second SIGTERM / SIGINT: the shutdown delay is cut")
        except asyncio.TimeoutError:
            pass
    log.info("shutting down: draining in-flight calls")
    await sidecar.close()
    if settings.worker_index is not None:  # For the supervisor's total line (`_workers`), not shown.
        print(drained_line(*sidecar.sidecar.drained), flush=True)
    if stand_in is not None:
        await stand_in.close()


def stop_on_sigint_or_sigterm() -> asyncio.Event:
    """An event set by the first SIGINT or SIGTERM (handled from now on, instead of killing)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    return stop


def ready_line(url: str, log_format: str) -> str:
    """``listening on URL`` -- a JSON log line with ``--log-format json``, like every other line."""
    if log_format != "json":
        return f"listening on {url}"
    return orjson.dumps({"time": utc_timestamp(), "level": "info", "logger": "mcc",
                         "message": f"listening on {url}", "url": url}).decode()


#: What a worker prints on its stdout after draining: its counts, for the supervisor's total.
DRAINED_MARK = "mcc-worker-drained "


def drained_line(finished: int, cut: int) -> str:
    return DRAINED_MARK + orjson.dumps({"finished": finished, "cut": cut}).decode()


def ready_url(line: str) -> str | None:
    """The URL of a `ready_line` (either format), or None when ``line`` is not one."""
    if line.startswith("listening on "):
        return line.split()[-1]
    if line.startswith("{"):
        try:
            url = orjson.loads(line).get("url")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        return url if isinstance(url, str) else None
    return None


def describe_startup(settings: Settings, upstream: str | None) -> str:
    """One line that says what this sidecar will do."""
    if settings.capture_on:
        capture = (f"capture on: dir {settings.capture_dir}, sync {settings.capture_sync}, "
                   f"raw stream {settings.capture_raw_stream}"
                   + (", token capture mode on" if settings.capture_tokens else ""))
    elif settings.capture_dir is None:
        capture = "capture off: no capture dir (--capture-dir)"
    else:
        capture = "capture off: disabled (--no-capture / observability_enabled: false)"
    workers = "" if settings.worker_index is not None else f"workers {settings.workers}; "  # A worker is one.
    if settings.capture_on:  # Which per-event core parses the replies: said once, here (docs/speed.md).
        capture += f"; {describe_privacy(settings)}; per-event core {per_event_core()}"
    return (f"forwarding to {upstream}; {capture}; {workers}"
            f"drain timeout {settings.drain_timeout:g}s; model_ref.name {settings.model_ref_name}")


def describe_privacy(settings: Settings) -> str:
    """What redaction is in force (docs/privacy.md): the privacy mode, the rules by name, the hook."""
    if settings.privacy != "full":
        return f"privacy {settings.privacy}" + (" (token ids kept)" if settings.privacy_keep_token_ids else "") \
            + ": no text is kept"
    if not settings.redact and not settings.redact_hook:
        return "privacy full: no redaction (--redact, --redact-hook)"
    said = []
    if settings.redact:
        from ..privacy import load_redaction  # Checked at load: it reads as it did then.
        rules, _ = load_redaction(settings.redact, None)
        said.append(f"redaction rules {', '.join(rule.name for rule in rules)} ({settings.redact})")
    if settings.redact_hook:
        said.append(f"redaction hook {settings.redact_hook} (budget {settings.redact_hook_budget:g}s)")
    return "privacy full, " + " and ".join(said)


def _why_not_listening(settings: Settings, exc: OSError) -> str:
    where = f"{settings.host}:{settings.port}"
    if isinstance(exc, socket.gaierror):
        return f"cannot listen on {where}: the host {settings.host!r} does not resolve ({exc.strerror or exc})"
    if exc.errno == errno.EADDRINUSE:
        return f"cannot listen on {where}: the port is already in use (pick another with --port, or 0 for any free port)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {where}: {settings.host!r} is not an address of this machine"
    if exc.errno == errno.EACCES:
        return f"cannot listen on {where}: permission denied (ports below 1024 need privileges)"
    return f"cannot listen on {where}: {exc.strerror or exc}"


def freeze_startup_objects() -> None:
    """Move every object alive after startup out of the cyclic collector's reach.

    The modules, pydantic schemas and settings loaded at startup (about 55,000 tracked objects)
    live as long as the process, yet each full collection scanned them all: a 27 ms pause now and
    then under load (measured at 500 req/s), felt by every call in flight. Frozen, a collection
    scans only what the calls themselves allocated. Reference counting still frees everything.
    """
    gc.collect()
    gc.freeze()




def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
