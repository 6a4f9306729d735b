"""RL traffic benchmark (issue 13): long logprob streams through the tap, the sidecar and `records`.

    python benchmarks/bench_rl.py [--quick]

1. The tap (parse + reassemble, one core) on vLLM-shaped chat streams of 2k, 16k and 32k tokens,
   plain and with one logprob entry + one token id per chunk: events/s, cost per event, and the
   ratios the issue sets (logprobs vs plain at 32k; per-event cost at 32k vs 2k).
2. The sidecar, capture on: p50 of short JSON calls (64 concurrent clients) alone, then while 16
   streams of 32k tokens with logprobs run (paced by `fast_upstream.RL_TOKENS_PER_S`), then alone
   again; the sidecar's peak RSS while the streams are open; the bytes of each captured line,
   with ``response_raw`` (``--capture-raw-stream always``) and without (``on-failure``).
3. `records.read_token_records` over the captures of 1,000 such calls (100 rollouts x 10),
   in a fresh process: records/s and peak RSS, beside parsing the same lines with orjson alone.

Prints markdown tables and writes them to benchmarks/results/rl.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import orjson  # noqa: E402

import bench_proxy as bp  # noqa: E402
from capture import StreamTap  # noqa: E402
from fast_upstream import RL_TOKENS, RL_TOKENS_PER_S, rl_events  # noqa: E402

RL_BODY = b'{"model":"bench","stream":true,"rl":true,"logprobs":true,"return_token_ids":true,"messages":[]}'


# -- 1. the tap -----------------------------------------------------------------------------------

def plain_events(tokens: int) -> list[bytes]:
    head = {"id": "chatcmpl-rl", "object": "chat.completion.chunk", "created": 1767225600, "model": "bench"}
    events = [b"data: " + orjson.dumps({**head, "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "logprobs": None,
                                                            "finish_reason": None}]}) + b"\n\n" for i in range(tokens)]
    return events + [b"data: [DONE]\n\n"]


def tap_seconds(events: list[bytes], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        tap = StreamTap("chat")
        for event in events:
            tap.feed(event)
        outcome = tap.finish(200)
        best = min(best, time.perf_counter() - started)
        assert outcome.error_category is None
    return best


def tap_table(quick: bool) -> list[str]:
    """With the cyclic collector on at Python's default thresholds, as in the sidecar: a long
    stream's kept logprob entries are what a collector rescans, so it must be in the figure."""
    lines = [f"## The tap: vLLM chat streams, one event per chunk (best of {2 if quick else 5}, one core, "
             f"cyclic GC on, thresholds {gc.get_threshold()})", "",
             "| tokens | plain events/s | with logprobs + token id events/s | ratio | µs/event plain | µs/event logprobs |",
             "|---:|---:|---:|---:|---:|---:|"]
    per_event: dict[tuple[int, str], float] = {}
    for tokens in (2_000, 16_000, 32_000):
        plain, rich = plain_events(tokens), rl_events(tokens)
        plain_s = tap_seconds(plain, 2 if quick else 5)
        rich_s = tap_seconds(rich, 2 if quick else 5)
        per_event[tokens, "plain"], per_event[tokens, "rich"] = plain_s / len(plain), rich_s / len(rich)
        lines.append(f"| {tokens:,} | {len(plain) / plain_s:,.0f} | {len(rich) / rich_s:,.0f} | "
                     f"{(len(rich) / rich_s) / (len(plain) / plain_s):.2f} | {per_event[tokens, 'plain'] * 1e6:.2f} | "
                     f"{per_event[tokens, 'rich'] * 1e6:.2f} |")
    lines += ["", f"Per-event cost at 32k / at 2k: plain {per_event[32_000, 'plain'] / per_event[2_000, 'plain']:.2f}x, "
                  f"with logprobs {per_event[32_000, 'rich'] / per_event[2_000, 'rich']:.2f}x (target <= 1.3x); "
                  f"logprobs / plain at 32k in events/s: {per_event[32_000, 'plain'] / per_event[32_000, 'rich']:.2f} (target >= 0.6).", ""]
    return lines


# -- 2. the sidecar under long streams -------------------------------------------------------------

async def short_calls(port: int, clients: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def client(n: int) -> None:
        connection = await bp.RawClient().connect(port)
        try:
            while time.perf_counter() < deadline:
                _, total, _ = await connection.request(bp.CHAT.format(n=n % bp.ROLLOUTS), bp.JSON_BODY)
                latencies.append(total)
        finally:
            connection.close()

    await asyncio.gather(*(client(n) for n in range(clients)))
    return latencies


async def long_streams(port: int, count: int) -> list[float]:
    """Each stream read in 64 KiB reads to its last chunk: the agent side must cost little, or the
    benchmark's own client, not the sidecar, is what slows the short calls (2 cores)."""
    async def one(n: int) -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        started = time.perf_counter()
        path = f"/ng-rollout/rl-{n}/v1/chat/completions".encode()
        writer.write(b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (path, len(RL_BODY), RL_BODY))
        tail = b""
        try:
            while not tail.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
                data = await reader.read(1 << 16)
                if not data:
                    raise RuntimeError("the stream ended early")
                tail = (tail + data)[-64:]
            return time.perf_counter() - started
        finally:
            writer.close()

    return list(await asyncio.gather(*(one(n) for n in range(count))))


async def sample_rss(target: bp.Target, stop: asyncio.Event) -> int:
    peak = 0
    while not stop.is_set():
        peak = max(peak, target.rss_bytes())
        await asyncio.sleep(0.1)
    return peak


async def sidecar_under_rl(quick: bool, workdir: str) -> tuple[list[str], bytes]:
    streams = 4 if quick else 16
    upstream = bp.start_upstream()
    capture_dir = os.path.join(workdir, "captures")
    os.makedirs(capture_dir)
    sidecar = bp.start_sidecar("on", upstream, capture_dir)
    try:
        await short_calls(sidecar.port, 64, 1.0)  # Warm up connections and pools.
        idle_rss = sidecar.rss_bytes()
        alone_before = await short_calls(sidecar.port, 64, 3.0)
        stop = asyncio.Event()
        rss_task = asyncio.create_task(sample_rss(sidecar, stop))
        stream_task = asyncio.create_task(long_streams(sidecar.port, streams))
        during: list[float] = []
        while not stream_task.done():
            during += await short_calls(sidecar.port, 64, 1.0)
        stream_seconds = await stream_task
        stop.set()
        peak_rss = await rss_task
        alone_after = await short_calls(sidecar.port, 64, 3.0)
    finally:
        sidecar.stop()
        upstream.stop()
    with open(os.path.join(capture_dir, "rl-0.capture.jsonl"), "rb") as handle:
        line = handle.readline()
    parsed = orjson.loads(line)
    without_raw = len(orjson.dumps({k: v for k, v in parsed.items() if k != "response_raw"})) + 1
    alone = statistics.mean([bp.pct(alone_before, 50), bp.pct(alone_after, 50)])
    ms = lambda s: f"{s * 1000:.2f}"  # noqa: E731
    lines = [f"## The sidecar, capture on: {streams} streams of {RL_TOKENS:,} tokens with logprobs + token ids "
             f"(each paced at {RL_TOKENS_PER_S:,} tokens/s) while 64 clients make short JSON calls", "",
             "| measure | value |", "|---|---:|",
             f"| short calls alone: p50 latency (ms), mean of before and after | {ms(alone)} |",
             f"| short calls during the long streams: p50 latency (ms) | {ms(bp.pct(during, 50))} |",
             f"| ratio during / alone (target <= 2) | {bp.pct(during, 50) / alone:.2f} |",
             f"| short calls during: p99 latency (ms) | {ms(bp.pct(during, 99))} |",
             f"| long streams: seconds each (median; {RL_TOKENS / RL_TOKENS_PER_S:.0f} s at the upstream's pace) | {statistics.median(stream_seconds):.1f} |",
             f"| sidecar RSS idle (MiB) | {idle_rss / 2**20:.0f} |",
             f"| sidecar peak RSS with the streams open (MiB) | {peak_rss / 2**20:.0f} |",
             f"| bytes of one captured line, response_raw kept (always) | {len(line):,} |",
             f"| bytes of the same line without response_raw (on-failure) | {without_raw:,} |",
             f"| bytes of the stream itself | {sum(len(e) for e in rl_events()):,} |", ""]
    return lines, line


# -- 3. read_token_records over 1,000 captured calls -----------------------------------------------

_READER = r"""
import os, resource, sys, time
sys.path.insert(0, sys.argv[2])
import orjson
from records import CaptureStore, read_token_records
store, mode = CaptureStore(sys.argv[1]), sys.argv[3]
started = time.perf_counter()
count = arrays = 0
for rollout_id in store.rollout_ids():
    if mode == "records":
        for record in read_token_records(store, rollout_id):
            count += 1
            arrays += len(record.generation_token_ids or ())
    else:
        import gc; gc.disable()  # As records does while parsing (records.store.gc_paused).
        with open(store.path_for(rollout_id), "rb") as handle:
            for line in handle:
                count += 1
                arrays += len(orjson.loads(line)["response"]["choices"][0]["token_ids"])
seconds = time.perf_counter() - started
print(count, arrays, seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def reader_table(line: bytes, quick: bool, workdir: str) -> list[str]:
    rollouts, per_rollout = (10, 10) if quick else (100, 10)
    directory = os.path.join(workdir, "many")
    os.makedirs(directory)
    parsed = orjson.loads(line)
    parsed.pop("response_raw", None)  # As --capture-raw-stream on-failure writes them (1/3 the bytes).
    template = orjson.dumps(parsed) + b"\n"
    call_id = parsed["model_call_id"].encode()
    for r in range(rollouts):
        with open(os.path.join(directory, f"rl-{r:03}.capture.jsonl"), "wb") as handle:
            for c in range(per_rollout):
                handle.write(template.replace(call_id, b"%032x" % (r * per_rollout + c), 1))
    total_bytes = len(template) * rollouts * per_rollout
    results = {}
    for mode in ("orjson", "records", "orjson", "records"):  # Interleaved: the machine is noisy.
        done = subprocess.run([sys.executable, "-c", _READER, directory, os.path.dirname(HERE), mode],
                              capture_output=True, text=True, check=True)
        count, arrays, seconds, rss = done.stdout.split()
        best = results.get(mode)
        if best is None or float(seconds) < best[2]:
            results[mode] = (int(count), int(arrays), float(seconds), int(rss))
    lines = [f"## Reading the captures of {rollouts * per_rollout:,} such calls ({rollouts} rollouts x {per_rollout}; "
             f"{total_bytes / 2**30:.2f} GiB, lines without response_raw; best of 2, a fresh process each)", "",
             "| reader | calls/s | token ids/s | peak RSS (MiB) |", "|---|---:|---:|---:|"]
    for mode, label in (("orjson", "orjson.loads per line (baseline: parse only)"), ("records", "records.read_token_records")):
        count, arrays, seconds, rss = results[mode]
        lines.append(f"| {label} | {count / seconds:,.1f} | {arrays / seconds:,.0f} | {rss / 2**20:,.0f} |")
    ratio = results["orjson"][2] / results["records"][2]
    lines += ["", f"read_token_records runs at {ratio:.2f}x the speed of parsing the lines alone.", ""]
    shutil.rmtree(directory)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds, 4 streams, 100 calls to read")
    quick = parser.parse_args().quick
    bp.ensure_tools()
    out = [f"# RL traffic (issue 13), Python {sys.version.split()[0]}, {os.cpu_count()} cores", ""]
    out += tap_table(quick)
    with tempfile.TemporaryDirectory() as workdir:
        table, line = asyncio.run(sidecar_under_rl(quick, workdir))
        out += table
        out += reader_table(line, quick, workdir)
    text = "\n".join(out)
    print(text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "rl.md"), "w", encoding="utf-8") as handle:
        handle.write(text + "\n")


if __name__ == "__main__":
    main()
