"""Serving the stand-in model server (an aiohttp app) on a real socket."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from ..app import stop_on_sigint_or_sigterm
from .replies import STAND_IN_MODEL, ExpertRouting
from .server import create_stand_in_app


@dataclass
class AppServer:
    """A started aiohttp runner (the stand-in model server) and its URL."""

    runner: web.AppRunner
    url: str

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_app(app: web.Application, host: str, port: int, drain_timeout: float = 25.0,
                    reuse_port: bool = False) -> AppServer:
    """Serve ``app`` on ``host:port`` (0 picks a free port) the way the sidecar needs it served."""
    runner = web.AppRunner(
        app,
        # A client that goes away cancels its handler, so the upstream request is cancelled too
        # and the GPU stops generating (issue 2); capture then finishes in a tracked task.
        handler_cancellation=True,
        # Request bodies are forwarded as sent: a gzip request body stays gzip (docs/wire.md).
        auto_decompress=False,
        access_log=None,
        # On SIGTERM: stop accepting, let in-flight calls finish up to this long (issue 6).
        shutdown_timeout=drain_timeout,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_port=reuse_port or None)
    await site.start()
    bound = _bound_port(runner)
    shown_host = f"[{host}]" if ":" in host else host
    return AppServer(runner, f"http://{shown_host}:{bound}")


async def start_stand_in(host: str = "127.0.0.1", port: int = 0, delay: float = 0.0,
                         force_include_usage: bool = False, routing: ExpertRouting | None = None,
                         engine: str = "vllm") -> AppServer:
    return await start_app(create_stand_in_app(delay, force_include_usage=force_include_usage, routing=routing,
                                               engine=engine), host, port)


async def serve_stand_in_forever(host: str, port: int, delay: float, force_include_usage: bool = False) -> None:
    """`mcc stand-in`: the stand-in model server alone until SIGINT or SIGTERM."""
    server = await start_stand_in(host, port, delay, force_include_usage)
    print(f"stand-in model server listening on {server.url} (model {STAND_IN_MODEL!r}; OpenAI Responses, Chat, "
          f"Completions and Anthropic Messages under /v1)", flush=True)
    stop = stop_on_sigint_or_sigterm()
    try:
        await stop.wait()
    finally:
        await server.close()


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError("the server did not bind a TCP port")
