"""The sidecar's own time on a call, by part, beside Bifrost's published buckets (docs/speed.md,
"Overhead by part").

    python benchmarks/bench_overhead.py [--seconds 6]

The sidecar with capture on and in the token capture mode, in front of `fast_upstream.py`, driven
by wrk at c=64 with 1 KB JSON calls and with the vLLM-shaped logprob stream in turn; each part's
mean and p50 per call are read from its ``mcc_call_overhead_seconds`` histogram (scraped before
and after each run). Beside them: Bifrost's buckets as its documentation publishes them (AWS
t3.medium, 2 vCPUs, 5,000 RPS, 1.37 KB replies: docs.getbifrost.ai/benchmarking/t3.medium),
matched to ours where there is a counterpart. Bifrost forwards and parses; it writes no line, so
it has no line, redaction or durable part.

Then the chat stream that asked no usage: the upstream sends the finish chunk and ``[DONE]`` 0.4 s
later; how long after the client had the finish chunk its line was on disk (the first call of a
process learns whether the upstream adds a usage chunk unasked, so it waits for ``[DONE]``; the
later ones do not).

Nothing is asserted; figures compare only within one run (docs/speed.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import sys
import tempfile
import time
import urllib.request

import orjson

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_proxy as bench  # noqa: E402

PARTS = ("request", "connect", "head", "first_byte", "parse", "line", "redaction", "durable")
MODES = {"capture on": (), "token mode": ("--capture-tokens", "--capture-raw-stream", "on-failure")}
WORKLOADS = {"JSON 1 KB": bench.JSON_BODY, "logprob stream": bench.LOGPROB_BODY}
#: Bifrost's published buckets on t3.medium (µs), and the part of ours each compares with.
BIFROST = (("Queue Wait Time", 47.13, None), ("Key Selection Time", 0.016, None),
           ("Message Formatting + Params Preparation + Request Body Preparation", 2.19 + 0.436 + 2.65, "request"),
           ("JSON Marshaling", 63.47, None), ("Request Setup", 6.59, "connect"), ("Error Handling", 0.189, None),
           ("Response Parsing", 11_300.0, "parse+line"),
           ("Bifrost's Overhead (excluding marshaling, the HTTP call and response parsing)", 59.0, "sum"))


def scrape(port: int) -> dict[str, tuple[float, float, list[tuple[float, float]]]]:
    """Each part's (sum, count, cumulative buckets) from /-/metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/metrics", timeout=10) as reply:
        text = reply.read().decode()
    parts: dict[str, tuple[float, float, list[tuple[float, float]]]] = {}
    for part in PARTS:
        total = re.search(rf'^mcc_call_overhead_seconds_sum\{{part="{part}"\}} (\S+)$', text, flags=re.M)
        count = re.search(rf'^mcc_call_overhead_seconds_count\{{part="{part}"\}} (\S+)$', text, flags=re.M)
        buckets = [(float("inf") if bound == "+Inf" else float(bound), float(value)) for bound, value in re.findall(
            rf'^mcc_call_overhead_seconds_bucket\{{le="([^"]+)",part="{part}"\}} (\S+)$', text, flags=re.M)]
        if total and count:
            parts[part] = (float(total[1]), float(count[1]), buckets)
    return parts


def per_call(before: dict, after: dict) -> dict[str, tuple[float, float]]:
    """Each part's mean and p50 (the bucket bound the median falls under) per call, in µs."""
    figures = {}
    for part, (total, count, buckets) in after.items():
        old_total, old_count, old_buckets = before.get(part, (0.0, 0.0, []))
        calls = count - old_count
        if calls <= 0:
            continue
        old = dict(old_buckets)
        p50 = next((bound for bound, value in buckets if value - old.get(bound, 0.0) >= calls / 2), float("inf"))
        figures[part] = ((total - old_total) / calls * 1e6, p50 * 1e6)
    return figures


def measure(upstream: bench.Target, seconds: int, workdir: str) -> dict[tuple[str, str], dict[str, tuple[float, float]]]:
    results = {}
    for mode, extra in MODES.items():
        capture_dir = tempfile.mkdtemp(prefix="mcc-overhead-")
        target = bench.start_sidecar(mode, upstream, capture_dir, extra=extra)
        try:
            for workload, body in WORKLOADS.items():
                bench.wrk_rps(target.port, 64, 1, workdir, body)  # Warm.
                before = scrape(target.port)
                bench.wrk_rps(target.port, 64, seconds, workdir, body)
                results[(mode, workload)] = per_call(before, scrape(target.port))
        finally:
            target.stop()
            shutil.rmtree(capture_dir, ignore_errors=True)
    return results


# -- a chat stream that asked no usage: its line against the client's finish chunk ----------------

async def _late_done_upstream(port: int) -> asyncio.AbstractServer:
    """A chat stream: two chunks, the finish chunk, then ``[DONE]`` 0.4 s later."""
    def chunk(delta: dict, finish: str | None) -> bytes:
        return b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [
            {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}) + b"\n\n"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await replies(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # The sidecar closed its keep-alive connection.
        finally:
            writer.close()

    async def replies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for event in (chunk({"role": "assistant", "content": "Hel"}, None), chunk({"content": "lo"}, "stop")):
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
            await asyncio.sleep(0.4)
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            await writer.drain()
    return await asyncio.start_server(serve, "127.0.0.1", port)


def _line_after_finish(port: int, capture_dir: str, rollout: str) -> float:
    """Seconds from the client having the finish chunk to the line on disk (0: it was there first)."""
    body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    path = os.path.join(capture_dir, f"{rollout}.capture.jsonl")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /ng-rollout/%s/v1/chat/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (rollout.encode(), len(body), body))
        received = b""
        while b'"finish_reason":"stop"' not in received:
            received += sock.recv(65536)
        finished = time.perf_counter()
        while not (os.path.exists(path) and os.path.getsize(path)):
            time.sleep(0.001)
        on_disk = time.perf_counter()
        while b"0\r\n\r\n" not in received:
            received += sock.recv(65536)
    return max(on_disk - finished, 0.0)


def usage_free_stream(calls: int = 5) -> list[float]:
    async def main() -> list[float]:
        upstream_port = bench.free_port()
        server = await _late_done_upstream(upstream_port)
        capture_dir = tempfile.mkdtemp(prefix="mcc-overhead-usage-")
        target = bench.start_sidecar("capture on", bench.Target("late done", upstream_port, None), capture_dir)
        try:
            return [await asyncio.to_thread(_line_after_finish, target.port, capture_dir, f"u{call}") for call in range(calls)]
        finally:
            target.stop()  # Its connections close: each `serve` ends.
            server.close()
            await server.wait_closed()
            shutil.rmtree(capture_dir, ignore_errors=True)
    return asyncio.run(main())


def report(args: argparse.Namespace, results: dict, after_finish: list[float]) -> str:
    lines = [f"# The sidecar's own time on a call, by part (wrk c=64, {args.seconds} s a cell; µs per call: mean / p50 "
             "bucket bound)", "",
             "| part | " + " | ".join(f"{mode}, {workload}" for mode, workload in results) + " |",
             "|---|" + "---:|" * len(results)]
    for part in PARTS:
        cells = [f"{figures[part][0]:,.1f} / {figures[part][1]:,.0f}" if part in figures else "-" for figures in results.values()]
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    sums = [sum(mean for mean, _ in figures.values()) for figures in results.values()]
    lines.append("| all parts (mean) | " + " | ".join(f"{total:,.1f}" for total in sums) + " |")
    lines += ["", "## Beside Bifrost's published buckets (t3.medium, 2 vCPUs, 5,000 RPS, 1.37 KB JSON replies)", "",
              "| Bifrost's bucket | Bifrost (µs) | ours, capture on, JSON 1 KB (µs, mean) |", "|---|---:|---:|"]
    ours = results.get(("capture on", "JSON 1 KB"), {})
    for name, micros, counterpart in BIFROST:
        if counterpart == "sum":  # Bifrost's is the sum of its buckets before the call, parsing left out.
            mine = f"{sum(ours[part][0] for part in ('request', 'connect', 'head', 'first_byte') if part in ours):,.1f}" \
                   " (request + connect + head: the same span)"
        elif counterpart == "parse+line":  # A JSON reply is parsed when its line is built.
            mine = f"{sum(ours[part][0] for part in ('parse', 'line') if part in ours):,.1f} (parse + line: a JSON " \
                   "reply is parsed as its line is built)"
        elif counterpart is None:
            mine = "no such part (bytes are forwarded as they came; one event loop, no queue)"
        else:
            mine = f"{ours[counterpart][0]:,.1f} ({counterpart})" if counterpart in ours else "-"
        lines.append(f"| {name} | {micros:,.2f} | {mine} |")
    lines.append(f"| (none: Bifrost writes no record) | - | durable {ours.get('durable', (0, 0))[0]:,.1f} (the capture's "
                 "own part: the line's fsync, shared by the calls in flight) |")
    lines += ["", "## A chat stream that asked no usage, `[DONE]` 0.4 s behind the finish chunk", "",
              "| call | its line on disk after the client had the finish chunk (ms) |", "|---:|---:|"]
    lines += [f"| {number + 1}{' (learns the upstream)' if number == 0 else ''} | {seconds * 1e3:.1f} |"
              for number, seconds in enumerate(after_finish)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=6)
    args = parser.parse_args()
    bench.ensure_tools()
    workdir = tempfile.mkdtemp(prefix="mcc-overhead-work-")
    upstream = bench.start_upstream()
    try:
        results = measure(upstream, args.seconds, workdir)
    finally:
        upstream.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    bench.publish("overhead", report(args, results, usage_free_stream()))


if __name__ == "__main__":
    main()
