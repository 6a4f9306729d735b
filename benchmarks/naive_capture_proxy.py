"""The naive capture proxy, a baseline for `bench_proxy.py` (issue 34): an aiohttp reverse proxy
that appends each call's raw request and reply bytes to its rollout's file and fsyncs them before
the client gets the end of the reply -- parsing nothing.

    python benchmarks/naive_capture_proxy.py PORT UPSTREAM_URL CAPTURE_DIR

What anyone would write in an afternoon with the field's usual library: the bar the sidecar's
capture (which also frames, rebuilds and records every event) is measured against. The body is
relayed as it comes (chunked when the upstream's is); the last bytes wait for the fsync.
"""

from __future__ import annotations

import asyncio
import os
import sys

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}


def make_app(upstream: str, capture_dir: str) -> web.Application:
    app = web.Application(client_max_size=256 * 1024 * 1024)
    state: dict = {}

    async def start(app: web.Application) -> None:
        state["session"] = ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=None),
                                         auto_decompress=False)

    async def stop(app: web.Application) -> None:
        await state["session"].close()

    def append(path: str, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    async def forward(request: web.Request) -> web.StreamResponse:
        try:
            return await relay(request)
        except ConnectionResetError:  # wrk closes its connections mid-reply when a run ends.
            return web.Response(status=499)

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        parts = request.path.split("/")
        rollout = parts[2] if len(parts) > 3 and parts[1] == "ng-rollout" else "_"
        target = "/" + "/".join(parts[3:]) if rollout != "_" else request.path
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with state["session"].request(request.method, upstream + target, data=body, headers=headers) as reply:
            response = web.StreamResponse(status=reply.status, reason=reply.reason,
                                          headers={k: v for k, v in reply.headers.items() if k.lower() not in _HOP_BY_HOP})
            if reply.headers.get("Content-Length") is not None:
                response.content_length = int(reply.headers["Content-Length"])
            else:
                response.enable_chunked_encoding()
            await response.prepare(request)
            kept, last = [body], b""
            async for chunk in reply.content.iter_any():
                kept.append(chunk)
                if last:
                    await response.write(last)
                last = chunk  # The last read waits for the fsync: the client sees the end after it.
        await asyncio.get_running_loop().run_in_executor(
            None, append, os.path.join(capture_dir, rollout + ".raw"), b"".join(kept) + b"\n")
        if last:
            await response.write(last)
        await response.write_eof()
        return response

    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


def main() -> None:
    port, upstream, capture_dir = int(sys.argv[1]), sys.argv[2].rstrip("/"), sys.argv[3]
    os.makedirs(capture_dir, exist_ok=True)
    web.run_app(make_app(upstream, capture_dir), host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    main()
