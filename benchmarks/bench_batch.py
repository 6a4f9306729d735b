"""A full vLLM batch through the sidecar in token capture mode (issue 20's targets).

    python benchmarks/bench_batch.py [--quick]

The agent asks for nothing (no ``logprobs``, no ``return_token_ids``); the sidecar runs with
``--capture-tokens``, so it adds both to every request, captures the arrays and cuts them from
every chunk the agent gets. The upstream (`fast_upstream`, ``"batch":true``) sends vLLM-shaped
streams of 8,000 tokens, each token a chunk with its logprob entry and token id, 200 tokens/s per
stream: 256 at once is ~50k tokens/s, a large GPU server's decode rate.

1. 256 such streams at once (``--capture-raw-stream on-failure``, then ``always``): the sidecar's
   peak RSS, and its CPU time per streamed token (user + system, from /proc, over the batch).
2. Short JSON calls (64 clients): p50 alone, then while 256 streams run at a GPU's pace (50
   tokens/s each: an 8B model on an H100 at that batch size), and the ratio. (At 200 tokens/s
   each, 51k tokens/s in all, one sidecar process is past one core with the mode on: use
   ``--workers``; see deploy/README.md.)
3. The bytes of one captured line of a 32,000-token call without ``response_raw``, and what
   takes the room.

Prints markdown tables and writes them to benchmarks/results/batch.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import orjson  # noqa: E402

import bench_proxy as bp  # noqa: E402
from bench_rl import sample_rss, short_calls  # noqa: E402
from fast_upstream import BATCH_TOKENS, BATCH_TOKENS_PER_S, GPU_TOKENS_PER_S, RL_TOKENS  # noqa: E402

AGENT_BODY = b'{"model":"bench","stream":true,"batch":true,"messages":[{"role":"user","content":"solve"}]}'
GPU_PACED_BODY = b'{"model":"bench","stream":true,"batch":true,"gpu_pace":true,"messages":[{"role":"user","content":"solve"}]}'
#: The baseline: an agent that asks for the arrays itself, the sidecar without the mode (same upstream bytes).
ASKING_BODY = (b'{"model":"bench","stream":true,"batch":true,"logprobs":true,"return_token_ids":true,'
               b'"messages":[{"role":"user","content":"solve"}]}')
AGENT_BODY_32K = b'{"model":"bench","stream":true,"rl":true,"messages":[{"role":"user","content":"solve"}]}'
_CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU seconds of the sidecar: its process and its children (the capture process appends its
    lines outside the token capture mode: its work is the sidecar's)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as handle:
            children += handle.read().split()
    own = (int(fields[11]) + int(fields[12])) / _CLK  # utime + stime
    return own + sum(cpu_seconds(int(child)) for child in children)


async def streams(port: int, count: int, body: bytes, rollout: str = "batch") -> list[int]:
    """``count`` streams at once, each read to its end; returns the bytes each agent received."""
    asking = b'"logprobs":true' in body

    async def one(n: int) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        path = f"/ng-rollout/{rollout}-{n}/v1/chat/completions".encode()
        writer.write(b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (path, len(body), body))
        received, tail = 0, b""
        try:
            while not tail.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
                data = await reader.read(1 << 16)
                if not data:
                    raise RuntimeError("the stream ended early")
                received += len(data)
                if not asking and b'"token_ids":[' in data:
                    raise RuntimeError("the agent received token ids it did not ask for")
                tail = (tail + data)[-64:]
            return received
        finally:
            writer.close()

    return list(await asyncio.gather(*(one(n) for n in range(count))))


async def batch_alone(raw_stream: str, count: int, workdir: str, mode: bool = True) -> dict[str, float]:
    upstream = bp.start_upstream()
    capture_dir = os.path.join(workdir, f"captures-{raw_stream}-{mode}")
    os.makedirs(capture_dir)
    extra = ("--capture-tokens",) if mode else ()
    sidecar = bp.start_sidecar("on", upstream, capture_dir, extra=(*extra, "--capture-raw-stream", raw_stream))
    try:
        measured = await measure_streams(sidecar, count, AGENT_BODY if mode else ASKING_BODY)
    finally:
        sidecar.stop()
        upstream.stop()
    with open(os.path.join(capture_dir, "batch-0.capture.jsonl"), "rb") as handle:
        line = handle.readline()
    parsed = orjson.loads(line)
    assert parsed.get("added_request_fields") == ({"logprobs": True, "return_token_ids": True,
                                                   "return_weight_versions": True} if mode else None)
    return {**measured, "tokens": count * BATCH_TOKENS, "received": statistics.mean(measured["received"]),
            "line": len(line)}


async def measure_streams(sidecar: bp.Target, count: int, body: bytes, rollout: str = "batch") -> dict:
    """``count`` streams at once through a warmed-up ``sidecar``: its RSS idle and at peak, its CPU
    seconds and the wall time over them, and the bytes each agent received (``received``)."""
    await short_calls(sidecar.port, 8, 0.5)
    idle = sidecar.rss_bytes()
    pid = sidecar.process.pid  # type: ignore[union-attr]
    cpu_before, started = cpu_seconds(pid), time.perf_counter()
    stop = asyncio.Event()
    sampling = asyncio.create_task(sample_rss(sidecar, stop))
    received = await streams(sidecar.port, count, body, rollout)
    stop.set()
    peak = await sampling
    return {"idle": idle, "peak": peak, "cpu": cpu_seconds(pid) - cpu_before, "elapsed": time.perf_counter() - started,
            "received": received}


async def short_calls_during_batch(count: int, workdir: str) -> dict[str, float]:
    """Short calls alone, then while ``count`` streams run at a GPU's pace (`GPU_TOKENS_PER_S`),
    for 20 s (the streams are then left: what matters is the sidecar while they flow)."""
    upstream = bp.start_upstream()
    capture_dir = os.path.join(workdir, "captures-latency")
    os.makedirs(capture_dir)
    sidecar = bp.start_sidecar("on", upstream, capture_dir, extra=("--capture-tokens", "--capture-raw-stream", "on-failure"))
    try:
        await short_calls(sidecar.port, 64, 1.0)
        alone_before = await short_calls(sidecar.port, 64, 3.0)
        batch = asyncio.create_task(streams(sidecar.port, count, GPU_PACED_BODY))
        await asyncio.sleep(3.0)  # Every stream open and flowing.
        during = await short_calls(sidecar.port, 64, 20.0)
        batch.cancel()
        try:
            await batch
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(2.0)  # The cut streams' lines written.
        alone_after = await short_calls(sidecar.port, 64, 3.0)
    finally:
        sidecar.stop()
        upstream.stop()
    alone = statistics.mean([bp.pct(alone_before, 50), bp.pct(alone_after, 50)])
    return {"alone": alone, "during": bp.pct(during, 50), "during_p99": bp.pct(during, 99)}


async def line_of_32k(workdir: str) -> dict[str, int]:
    upstream = bp.start_upstream()
    capture_dir = os.path.join(workdir, "captures-32k")
    os.makedirs(capture_dir)
    sidecar = bp.start_sidecar("on", upstream, capture_dir, extra=("--capture-tokens", "--capture-raw-stream", "on-failure"))
    try:
        await streams(sidecar.port, 1, AGENT_BODY_32K, rollout="long")
    finally:
        sidecar.stop()
        upstream.stop()
    with open(os.path.join(capture_dir, "long-0.capture.jsonl"), "rb") as handle:
        line = handle.readline()
    with open(os.path.join(capture_dir, "long-0.tokens.jsonl"), "rb") as handle:
        entry = handle.readline()
    parsed, stored = orjson.loads(line), orjson.loads(entry)
    choice = parsed["response"]["choices"][0]
    parts = {
        "the whole line": len(line),
        "message (the text)": len(orjson.dumps(choice["message"])),
        "request": len(orjson.dumps(parsed["request"])),
    }
    parts["the line's everything else"] = parts["the whole line"] - sum(v for k, v in parts.items() if k != "the whole line")
    parts["the training-token entry"] = len(entry)
    parts["its generation_token_ids"] = len(orjson.dumps(stored["generation_token_ids"]))
    parts["its generation_log_probs"] = len(orjson.dumps(stored["generation_log_probs"]))
    parts["its prompt_token_ids"] = len(orjson.dumps(stored["prompt_token_ids"]))
    return parts


def tap_level(quick: bool) -> list[str]:
    """Like bench_rl's tap table (the issue's "plain logprob capture 5-9 µs"), per event of an
    8,000-token stream read 40 events at a time: the tap alone (an agent that asks for the arrays,
    no mode) against the tap and the cutter (the mode: capture, then cut what was added)."""
    from capture import AddedFieldCutter, CuttingStreamTap, StreamTap
    from fast_upstream import rl_events

    events = rl_events(BATCH_TOKENS)
    chunks = [b"".join(events[i:i + 40]) for i in range(0, len(events), 40)]

    def per_event(mode: bool) -> float:
        best = float("inf")
        for _ in range(3 if quick else 7):
            started = time.perf_counter()
            cutter = AddedFieldCutter("chat", {"logprobs": True, "return_token_ids": True}, {}) if mode else None
            tap = (CuttingStreamTap("chat", compact_arrays=True, raw_window=256 * 1024, cutter=cutter) if cutter is not None
                   else StreamTap("chat", compact_arrays=True, raw_window=256 * 1024))
            for chunk in chunks:
                tap.feed(chunk)
                tap.take_output()
            tap.finish(200)
            best = min(best, time.perf_counter() - started)
        return best / len(events) * 1e6

    rows = [(per_event(False), per_event(True)) for _ in range(2 if quick else 5)]  # Interleaved: the machine is noisy.
    plain, mode = min(r[0] for r in rows), min(r[1] for r in rows)
    return ["## Per streamed token, in process (best of several; one core)", "",
            "| path | µs per token | target |", "|---|---:|---|",
            f"| capture of an agent that asks for logprobs + token ids (the tap) | {plain:.2f} | (the baseline) |",
            f"| token capture mode: the same capture, plus cutting what was added | {mode:.2f} | <= 10 |",
            f"| the mode's own share (the cut, less the logprob entries it need not keep: the agent asked for none) "
            f"| {mode - plain:.2f} | |", ""]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="64 streams instead of 256")
    count = 64 if parser.parse_args().quick else 256
    bp.ensure_tools()
    mib = lambda b: f"{b / 2**20:,.0f}"  # noqa: E731
    out = [f"# A full vLLM batch in token capture mode (issue 20), Python {sys.version.split()[0]}, {os.cpu_count()} cores", ""]
    out += tap_level(count < 256)
    with tempfile.TemporaryDirectory() as workdir:
        runs = {mode: asyncio.run(batch_alone(mode, count, workdir)) for mode in ("on-failure", "always")}
        baseline = asyncio.run(batch_alone("on-failure", count, workdir, mode=False))
        latency = asyncio.run(short_calls_during_batch(count, workdir))
        line = asyncio.run(line_of_32k(workdir))
    out += [f"## {count} streams of {BATCH_TOKENS:,} tokens at once ({BATCH_TOKENS_PER_S} tokens/s each), logprobs and "
            "token ids added by the sidecar, captured, and cut from every chunk", "",
            "| --capture-raw-stream | sidecar RSS idle (MiB) | peak RSS (MiB) | target | sidecar CPU µs per streamed token | | "
            "seconds | bytes each agent received | bytes per captured line |",
            "|---|---:|---:|---|---:|---|---:|---:|---:|"]
    for mode, run in [*runs.items(), ("on-failure, no mode: the agent asks for the arrays itself", baseline)]:
        out.append(f"| {mode} | {mib(run['idle'])} | {mib(run['peak'])} | <= 1,024 | {run['cpu'] / run['tokens'] * 1e6:.2f} | "
                   f"(whole process) | {run['elapsed']:.1f} | {run['received']:,.0f} | {run['line']:,} |")
    out += ["", "CPU per streamed token here is the whole sidecar process (reading, parsing, capturing, cutting, "
                "writing, both sockets) over the batch; the last row is the same bytes from the upstream without "
                "the mode, for the mode's own share.", ""]
    ms = lambda s: f"{s * 1000:.2f}"  # noqa: E731
    out += ["", f"## Short JSON calls (64 clients) alone and while {count} streams run at a GPU's pace ({GPU_TOKENS_PER_S} tokens/s "
                f"each, {count * GPU_TOKENS_PER_S:,} in all), token capture mode, on-failure", "",
            "| measure | value |", "|---|---:|",
            f"| p50 alone (ms), mean of before and after | {ms(latency['alone'])} |",
            f"| p50 during the batch (ms) | {ms(latency['during'])} |",
            f"| ratio during / alone (target <= 2) | {latency['during'] / latency['alone']:.2f} |",
            f"| p99 during the batch (ms) | {ms(latency['during_p99'])} |", "",
            f"## One {RL_TOKENS:,}-token call on disk, without response_raw (on-failure): its line (what the agent "
            "saw) and its training-token entry (the arrays, once)", "",
            "| part | bytes | per generated token |", "|---|---:|---:|"]
    for part, size in line.items():
        out.append(f"| {part} | {size:,} | {size / RL_TOKENS:.1f} |")
    out.append("")
    text = "\n".join(out)
    print(text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "batch.md"), "w", encoding="utf-8") as handle:
        handle.write(text + "\n")


if __name__ == "__main__":
    main()
