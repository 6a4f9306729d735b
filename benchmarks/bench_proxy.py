"""Side-by-side proxy benchmark: direct vs nginx vs the sidecar (capture off / on, 1 and 2 workers).

    make bench            (or: python benchmarks/bench_proxy.py [--quick])

Everything runs on loopback on this machine, interleaved over several rounds, so every ratio
compares figures measured under the same load. It prints a markdown table and writes it to
benchmarks/results/latest.md. nginx and wrk are installed with apt-get when missing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from records.contract.reading import append_capture_line  # noqa: E402
from records.contract import encode_capture_line  # noqa: E402

CHAT = "/ng-rollout/bench-{n}/v1/chat/completions"
ROLLOUTS = 64
JSON_BODY = b'{"model":"bench","messages":[{"role":"user","content":"hello"}]}'
STREAM_BODY = b'{"model":"bench","stream":true,"messages":[{"role":"user","content":"hello"}]}'
#: Events in each streamed reply of `fast_upstream` (``"stream":true``).
STREAM_EVENTS = 256
HOLD_BODY = b'{"model":"bench","stream":true,"hold":true,"messages":[]}'
#: A vLLM-shaped stream with a logprob entry and a token id per chunk (fast_upstream), whole in one write.
LOGPROB_BODY = b'{"model":"bench","stream":true,"logprob_stream":true,"messages":[{"role":"user","content":"hello"}]}'
BIG_BODY = b'{"model":"bench","messages":[{"role":"user","content":"' + b"x" * (1024 * 1024) + b'"}]}'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ensure_tools() -> None:
    missing = [pkg for tool, pkg in (("nginx", "nginx-light"), ("wrk", "wrk")) if shutil.which(tool) is None]
    if missing:
        print(f"installing {' '.join(missing)} with apt-get ...", file=sys.stderr)
        subprocess.run(["apt-get", "update", "-qq"], check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True)


# -- the servers ------------------------------------------------------------------------------

@dataclass
class Target:
    name: str
    port: int
    process: subprocess.Popen | None = None
    pids: list[int] = field(default_factory=list)

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def rss_bytes(self) -> int:
        total = 0
        for pid in self.pids or ([self.process.pid] if self.process else []):
            with open(f"/proc/{pid}/status", encoding="ascii") as handle:
                total += next(int(line.split()[1]) * 1024 for line in handle if line.startswith("VmRSS:"))
        return total


def start_upstream() -> Target:
    port = free_port()
    process = subprocess.Popen([sys.executable, os.path.join(HERE, "fast_upstream.py"), str(port)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
    return Target("direct", port, process)


def start_nginx(upstream: Target, workdir: str) -> Target:
    port = free_port()
    config = f"""
worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {workdir}/body; proxy_temp_path {workdir}/proxy;
  fastcgi_temp_path {workdir}/fcgi; uwsgi_temp_path {workdir}/uwsgi; scgi_temp_path {workdir}/scgi;
  client_max_body_size 256m; client_body_buffer_size 2m;
  keepalive_requests 1000000;  # The bench's clients keep one connection for thousands of requests.
  upstream model {{ server 127.0.0.1:{upstream.port}; keepalive 256; keepalive_requests 1000000; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://model;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
  }}
}}
"""
    path = os.path.join(workdir, "nginx.conf")
    with open(path, "w", encoding="ascii") as handle:
        handle.write(config)
    process = subprocess.Popen(["nginx", "-c", path, "-p", workdir], stderr=subprocess.DEVNULL)
    _wait_for_port(port)
    return Target("nginx", port, process)


def start_naive(upstream: Target, capture_dir: str) -> Target:
    """The naive capture proxy (`naive_capture_proxy.py`): aiohttp, raw bytes appended and fsynced."""
    port = free_port()
    process = subprocess.Popen([sys.executable, os.path.join(HERE, "naive_capture_proxy.py"), str(port),
                                f"http://127.0.0.1:{upstream.port}", capture_dir])
    _wait_for_port(port)
    return Target("naive capture proxy", port, process)


def start_sidecar(name: str, upstream: Target, capture_dir: str | None, workers: int = 1,
                  extra: tuple[str, ...] = (), program: tuple[str, ...] = ("-m", "proxy"),
                  environment: dict[str, str] | None = None) -> Target:
    """``program``: what Python runs before ``serve ...`` (`bench_floors.py` runs a sidecar with a
    part of capture taken out); ``environment``: variables set for it (``MCC_NO_EXTENSIONS``)."""
    port = free_port()
    args = [sys.executable, *program, "serve", "--upstream", f"http://127.0.0.1:{upstream.port}", "--port", str(port),
            "--log-level", "error", "--workers", str(workers), *extra]
    if capture_dir:
        args += ["--capture-dir", capture_dir]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, **environment} if environment else None)
    assert process.stdout.readline().startswith("listening on")  # type: ignore[union-attr]
    target = Target(name, port, process)
    if workers > 1:
        children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
        target.pids = [int(pid) for pid in children]
    return target


def _wait_for_port(port: int) -> None:
    for _ in range(200):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listens on {port}")


# -- a minimal keep-alive HTTP/1.1 client -----------------------------------------------------

class RawClient:
    """One keep-alive connection; `request` returns (seconds to first body bytes, total seconds, body)."""

    async def connect(self, port: int) -> "RawClient":
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        return self

    async def request(self, path: str, body: bytes) -> tuple[float, float, bytes]:
        started = time.perf_counter()
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                          % (path.encode(), len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        lower = head.lower()
        if b"transfer-encoding: chunked" in lower:
            return await self._chunked(started)
        at = lower.find(b"content-length:")
        length = int(lower[at + 15:lower.find(b"\r\n", at)])
        first = await self.reader.read(1)
        ttft = time.perf_counter() - started
        rest = await self.reader.readexactly(length - 1)
        return ttft, time.perf_counter() - started, first + rest

    async def _chunked(self, started: float) -> tuple[float, float, bytes]:
        body, ttft = [], None
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if ttft is None:
                ttft = time.perf_counter() - started
            if size == 0:
                await self.reader.readuntil(b"\r\n")
                return ttft, time.perf_counter() - started, b"".join(body)
            body.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)

    def close(self) -> None:
        self.writer.close()


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def sequential(port: int, body: bytes, count: int) -> tuple[list[float], list[float]]:
    client = await RawClient().connect(port)
    ttfts, totals = [], []
    try:
        for n in range(count):
            ttft, total, _ = await client.request(CHAT.format(n=n % ROLLOUTS), body)
            ttfts.append(ttft)
            totals.append(total)
    finally:
        client.close()
    return ttfts, totals


async def open_loop(port: int, rate: float, seconds: float) -> list[float]:
    """Latencies of requests fired at a fixed rate, measured from their scheduled time."""
    pool: asyncio.Queue[RawClient] = asyncio.Queue()
    for _ in range(64):
        pool.put_nowait(await RawClient().connect(port))
    latencies: list[float] = []
    start = time.perf_counter()

    async def fire(scheduled: float, n: int) -> None:
        client = await pool.get()
        await client.request(CHAT.format(n=n % ROLLOUTS), JSON_BODY)
        latencies.append(time.perf_counter() - scheduled)
        pool.put_nowait(client)

    tasks = []
    for n in range(int(rate * seconds)):
        scheduled = start + n / rate
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        tasks.append(asyncio.create_task(fire(scheduled, n)))
    await asyncio.gather(*tasks)
    while not pool.empty():
        pool.get_nowait().close()
    return latencies


def wrk_post_script(workdir: str, body: bytes, rollout_prefix: str = "bench") -> str:
    """wrk's Lua script POSTing ``body``; each request names one of 64 rollouts, as concurrent
    agents of a training step do."""
    script = os.path.join(workdir, f"{rollout_prefix}-post.lua")
    with open(script, "w", encoding="ascii") as handle:
        handle.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                     f"wrk.body = '{body.decode()}'\n"
                     "counter = 0\nrequest = function()\n  counter = counter + 1\n"
                     f'  return wrk.format(nil, "/ng-rollout/{rollout_prefix}-" .. (counter % 64) .. '
                     '"/v1/chat/completions")\nend\n')
    return script


def wrk_rps(port: int, concurrency: int, seconds: int, workdir: str, body: bytes = JSON_BODY) -> float:
    script = wrk_post_script(workdir, body)
    out = subprocess.run(["wrk", "-t2", f"-c{concurrency}", f"-d{seconds}s", "-s", script,
                          f"http://127.0.0.1:{port}/"], capture_output=True, text=True).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec")))


def wrk_events(port: int, concurrency: int, seconds: int, workdir: str, body: bytes = STREAM_BODY) -> float:
    """Events/s delivered to wrk (C: the client is not what limits the figure) reading 256-event
    streams back to back; wrk reads every chunked body to its end."""
    return wrk_rps(port, concurrency, seconds, workdir, body) * STREAM_EVENTS


def interleaved_modes(upstream: Target, modes: dict[str, tuple[str, ...]], rounds: int, seconds: int,
                      workdir: str) -> dict[str, dict[str, list[float]]]:
    """Each mode's sidecar (its extra flags), started fresh in each of ``rounds`` interleaved rounds
    in front of ``upstream``: 1 KB JSON requests/s and the logprob stream's events/s at c=64, one
    value per round under ``"json"`` and ``"logprob"``."""
    figures: dict[str, dict[str, list[float]]] = {name: {"json": [], "logprob": []} for name in modes}
    for _ in range(rounds):
        for name, extra in modes.items():
            capture_dir = tempfile.mkdtemp(prefix="mcc-modes-cap-")
            target = start_sidecar(name, upstream, capture_dir, extra=extra)
            try:
                figures[name]["json"].append(wrk_rps(target.port, 64, seconds, workdir))
                figures[name]["logprob"].append(wrk_events(target.port, 64, seconds, workdir, LOGPROB_BODY))
            finally:
                target.stop()
                shutil.rmtree(capture_dir, ignore_errors=True)
    return figures


def modes_table(figures: dict[str, dict[str, list[float]]], rounds: int, seconds: int,
                baseline: tuple[str, str] | None = None) -> tuple[list[str], dict[str, dict[str, float]]]:
    """`interleaved_modes`' figures as a Markdown table of medians (min - max), with each against
    ``baseline`` (its mode's name, its label in the header) when given; and the medians."""
    med = {name: {key: statistics.median(values) for key, values in by.items()} for name, by in figures.items()}
    ratio = f" x {baseline[1]} |" if baseline else ""
    lines = [f"{rounds} interleaved rounds of {seconds} s, wrk at c=64; medians (min - max)", "",
             f"| sidecar | JSON 1 KB req/s |{ratio} logprob stream events/s |{ratio}",
             "|---|---:|" + ("---:|" if baseline else "") + "---:|" + ("---:|" if baseline else "")]
    for name, by in figures.items():
        cells = []
        for kind in ("json", "logprob"):
            cells.append(f" {med[name][kind]:,.0f} ({min(by[kind]):,.0f} - {max(by[kind]):,.0f}) |")
            if baseline:
                cells.append(f" {med[name][kind] / med[baseline[0]][kind]:.2f} |")
        lines.append(f"| {name} |" + "".join(cells))
    return lines, med


def publish(name: str, text: str) -> None:
    """A benchmark's tables, printed and kept as benchmarks/results/<name>.md."""
    print(text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", f"{name}.md"), "w", encoding="utf-8") as handle:
        handle.write(text)


async def rss_with_open_streams(target: Target, streams: int) -> int:
    clients = []
    for n in range(streams):
        client = await RawClient().connect(target.port)
        client.writer.write(b"POST %s HTTP/1.1\r\nHost: b\r\nContent-Length: %d\r\n\r\n%s"
                            % (CHAT.format(n=n % ROLLOUTS).encode(), len(HOLD_BODY), HOLD_BODY))
        clients.append(client)
    for client in clients:
        await client.reader.readuntil(b"data: ")
    await asyncio.sleep(1)
    rss = target.rss_bytes()
    for client in clients:
        client.close()
    return rss


def fsync_p50(directory: str) -> float:
    line = encode_capture_line({"model_call_id": "x" * 32, "request": {"pad": "y" * 2000}})
    path = os.path.join(directory, "fsync-probe.capture.jsonl")
    timings = []
    for _ in range(300):
        started = time.perf_counter()
        append_capture_line(path, line)
        timings.append(time.perf_counter() - started)
    os.unlink(path)
    return statistics.median(timings)


# -- the run ----------------------------------------------------------------------------------

async def run(quick: bool) -> str:
    rounds, seq_n, stream_n, wrk_s = (1, 300, 100, 3) if quick else (3, 1500, 400, 5)
    work = tempfile.mkdtemp(prefix="mcc-bench-")
    capture_dir = os.path.join(work, "captures")
    os.makedirs(capture_dir)
    upstream = start_upstream()
    naive_dir, token_dir = os.path.join(work, "naive"), os.path.join(work, "token-mode")
    targets = [upstream, start_nginx(upstream, work), start_naive(upstream, naive_dir),
               start_sidecar("sidecar, capture off", upstream, None),
               start_sidecar("sidecar, capture on", upstream, capture_dir),
               start_sidecar("sidecar, token mode", upstream, token_dir,
                             extra=("--capture-tokens", "--capture-raw-stream", "on-failure"))]
    scaling = [start_sidecar("sidecar x2, capture off", upstream, None, workers=2),
               start_sidecar("sidecar x2, capture on", upstream, capture_dir, workers=2)]
    try:
        results: dict[str, dict[str, list[float]]] = {t.name: {} for t in targets + scaling}

        def add(name: str, key: str, values: list[float] | float) -> None:
            results[name].setdefault(key, []).extend(values if isinstance(values, list) else [values])

        for target in targets:  # The events/s figures count STREAM_EVENTS per reply: check it.
            _, _, body = await (await RawClient().connect(target.port)).request(CHAT.format(n=0), STREAM_BODY)
            assert body.count(b"\ndata: ") + body.startswith(b"data: ") == STREAM_EVENTS, target.name
        for _ in range(rounds):
            for target in targets:  # Interleaved: every round measures every target once.
                _, totals = await sequential(target.port, JSON_BODY, seq_n)
                add(target.name, "json_c1", totals)
                ttfts, _ = await sequential(target.port, STREAM_BODY, stream_n)
                add(target.name, "ttft_c1", ttfts)
                ttfts, _ = await sequential(target.port, LOGPROB_BODY, stream_n)
                add(target.name, "ttft_logprob_c1", ttfts)
                _, big = await sequential(target.port, BIG_BODY, 20)
                add(target.name, "big_body", big)
                add(target.name, "rps_c64", wrk_rps(target.port, 64, wrk_s, work))
                add(target.name, "events_c64", wrk_events(target.port, 64, wrk_s, work))
                add(target.name, "logprob_events_c64", wrk_events(target.port, 64, wrk_s, work, LOGPROB_BODY))
            for target in scaling:
                add(target.name, "rps_c64", wrk_rps(target.port, 64, wrk_s, work))
        for target in targets[2:]:
            # The rounds above left hundreds of MB of capture lines for the kernel to write back; a
            # barrier (syncfs) waits for that, so each latency run starts with nothing dirty.
            os.sync()
            add(target.name, "open_loop_500", await open_loop(target.port, 500, 5 if quick else 10))
        add("direct", "open_loop_500", await open_loop(upstream.port, 500, 5 if quick else 10))
        # A sidecar of its own: one that just served the logprob streams holds its high-water mark.
        fresh = start_sidecar("sidecar, capture on (fresh)", upstream, os.path.join(work, "rss"))
        try:
            rss = await rss_with_open_streams(fresh, 500)
        finally:
            fresh.stop()
        fsync = fsync_p50(capture_dir)
    finally:
        for target in targets + scaling:
            target.stop()
        shutil.rmtree(work, ignore_errors=True)  # The captures of a full run take gigabytes.
    return report(results, rss, fsync)


def report(results: dict[str, dict[str, list[float]]], rss: int, fsync: float) -> str:
    direct, nginx, naive = results["direct"], results["nginx"], results["naive capture proxy"]
    off, on, token = results["sidecar, capture off"], results["sidecar, capture on"], results["sidecar, token mode"]
    columns = (direct, nginx, naive, off, on, token)
    ms = lambda seconds: f"{seconds * 1000:.3f}"  # noqa: E731
    med = lambda d, k: statistics.median(d[k])  # noqa: E731

    def added(d: dict, key: str, p: float) -> float:
        """The target's p-th percentile over direct's median: a tail measured against the typical
        direct call (a difference of two p99s, direct's own spread, went below the p50)."""
        return pct(d[key], p) - pct(direct[key], 50)

    lines = [f"# Proxy benchmark — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"Machine: {os.cpu_count()} cores, {platform.machine()}, Linux {platform.release()}; Python {platform.python_version()}; "
             f"httptools {_version('httptools')}, uvloop {_version('uvloop')}, "
             f"{subprocess.run(['nginx', '-v'], capture_output=True, text=True).stderr.strip()}; fsync p50 of the capture dir {ms(fsync)} ms.",
             "", "Everything on loopback on this machine; the load generators (a Python keep-alive client, wrk) share its cores.", "",
             "| measure | direct | nginx | naive capture proxy | sidecar, capture off | sidecar, capture on | sidecar, token mode |",
             "|---|---:|---:|---:|---:|---:|---:|"]

    def row(label: str, cells: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    row("JSON 1 KB, c=1: p50 latency (ms)", [ms(pct(d["json_c1"], 50)) for d in columns])
    row("JSON 1 KB, c=1: added p50 / p99 over direct's p50 (ms)", ["-"] + [f"{ms(added(d, 'json_c1', 50))} / {ms(added(d, 'json_c1', 99))}" for d in columns[1:]])
    row("JSON 1 KB, c=64: requests/s (wrk)", [f"{med(d, 'rps_c64'):,.0f}" for d in columns])
    row("stream 256 events, c=1: added TTFT p50 / p99 over direct's p50 (ms)", ["-"] + [f"{ms(added(d, 'ttft_c1', 50))} / {ms(added(d, 'ttft_c1', 99))}" for d in columns[1:]])
    row("stream 256 events, c=64: events/s delivered (wrk)", [f"{med(d, 'events_c64'):,.0f}" for d in columns])
    row("vLLM-shaped logprob stream (85 KB, one read), c=1: added TTFT p50 / p99 over direct's p50 (ms)", ["-"] + [
        f"{ms(added(d, 'ttft_logprob_c1', 50))} / {ms(added(d, 'ttft_logprob_c1', 99))}" for d in columns[1:]])
    row("vLLM-shaped logprob stream, c=64: events/s delivered (wrk)", [f"{med(d, 'logprob_events_c64'):,.0f}" for d in columns])
    row("1 MiB request body: added p50 (ms)", ["-"] + [ms(added(d, "big_body", 50)) for d in columns[1:]])
    row("open loop 500 req/s: added p99 over direct's p50 (ms)", ["-", "-"] + [ms(added(d, "open_loop_500", 99)) for d in columns[2:]])
    lines += ["", "## Issue 34's targets", "", "| measure | measured | target |", "|---|---:|---:|",
              f"| added p50, JSON, c=1, capture on | {ms(added(on, 'json_c1', 50))} ms | <= 0.4 ms |",
              f"| JSON req/s, c=64, capture on / nginx | {med(on, 'rps_c64') / med(nginx, 'rps_c64'):.2f} x | >= 0.25 x |",
              f"| streaming events/s, c=64, capture on / naive capture proxy | {med(on, 'events_c64') / med(naive, 'events_c64'):.2f} x | >= 1.5 x |",
              f"| added TTFT, a whole vLLM-shaped stream in one read, capture on | {ms(added(on, 'ttft_logprob_c1', 50))} ms | <= 0.5 ms |",
              f"| added TTFT, the same, token mode | {ms(added(token, 'ttft_logprob_c1', 50))} ms | <= 0.5 ms |",
              f"| token mode, vLLM-shaped logprob stream events/s / naive (same bytes) | "
              f"{med(token, 'logprob_events_c64') / med(naive, 'logprob_events_c64'):.2f} x | >= 1 x |",
              f"| capture on (no token mode), the same / naive | "
              f"{med(on, 'logprob_events_c64') / med(naive, 'logprob_events_c64'):.2f} x | - |"]
    lines += ["", "| ratio | capture off | capture on |", "|---|---:|---:|"]
    lines.append(f"| requests/s c=64, sidecar / direct | {med(off, 'rps_c64') / med(direct, 'rps_c64'):.2f} | {med(on, 'rps_c64') / med(direct, 'rps_c64'):.2f} |")
    lines.append(f"| requests/s c=64, sidecar / nginx | {med(off, 'rps_c64') / med(nginx, 'rps_c64'):.2f} | {med(on, 'rps_c64') / med(nginx, 'rps_c64'):.2f} |")
    lines.append(f"| requests/s c=64, 2 workers / 1 worker | {med(results['sidecar x2, capture off'], 'rps_c64') / med(off, 'rps_c64'):.2f} "
                 f"| {med(results['sidecar x2, capture on'], 'rps_c64') / med(on, 'rps_c64'):.2f} |")
    lines.append(f"| events/s c=64, sidecar / direct | {med(off, 'events_c64') / med(direct, 'events_c64'):.2f} | {med(on, 'events_c64') / med(direct, 'events_c64'):.2f} |")
    lines += ["", f"Sidecar RSS with 500 streams open (capture on): {rss / 2**20:.0f} MiB.",
              f"Upstream ceiling (direct, wrk c=64): {med(direct, 'rps_c64'):,.0f} requests/s; "
              f"{med(direct, 'events_c64'):,.0f} events/s (wrk reading 256-event streams)."]
    return "\n".join(lines) + "\n"


def _version(package: str) -> str:
    try:
        from importlib.metadata import version
        return version(package)
    except Exception:
        return "not installed"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one short round (a smoke test of the harness)")
    args = parser.parse_args()
    ensure_tools()
    table = asyncio.run(run(args.quick))
    print(table)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "latest.md"), "w", encoding="utf-8") as handle:
        handle.write(table)


if __name__ == "__main__":
    main()
