"""The sidecar's peak memory under vLLM's default batch on an H100-class GPU (issue 34).

    python benchmarks/bench_memory.py [--streams N]

1,024 streams of 12,000 tokens at once (`fast_upstream`, ``"memory":true``: vLLM-shaped chunks, a
logprob entry and a token id in each, 60 tokens/s per stream so that all of them stay open
together), through one sidecar process in the token capture mode with ``--capture-raw-stream
on-failure`` (the RL setting): its peak RSS, per stream, and the budget that follows for
deploy/README.md. Writes benchmarks/results/memory.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import bench_proxy as bp  # noqa: E402
from bench_batch import measure_streams  # noqa: E402
from fast_upstream import MEMORY_TOKENS, MEMORY_TOKENS_PER_S  # noqa: E402

BODY = b'{"model":"bench","stream":true,"memory":true,"messages":[{"role":"user","content":"solve"}]}'


async def run(count: int) -> list[str]:
    workdir = tempfile.mkdtemp(prefix="mcc-bench-memory-")
    upstream = bp.start_upstream()
    capture_dir = os.path.join(workdir, "captures")
    os.makedirs(capture_dir)
    sidecar = bp.start_sidecar("on", upstream, capture_dir,
                               extra=("--capture-tokens", "--capture-raw-stream", "on-failure"))
    try:
        measured = await measure_streams(sidecar, count, BODY, rollout="memory")
        lines = sum(1 for name in os.listdir(capture_dir) if name.endswith(".capture.jsonl"))
    finally:
        sidecar.stop()
        upstream.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    idle, peak, cpu, elapsed, received = (measured[key] for key in ("idle", "peak", "cpu", "elapsed", "received"))
    tokens = count * MEMORY_TOKENS
    per_stream = (peak - idle) / count
    mib = 2 ** 20
    return [f"# Peak memory: {count:,} streams x {MEMORY_TOKENS:,} tokens, token capture mode, on-failure", "",
            f"{MEMORY_TOKENS_PER_S} tokens/s per stream, all open together; {lines:,} lines written; "
            f"{elapsed:.0f} s; sidecar CPU {cpu / tokens * 1e6:.2f} µs per streamed token (whole process).", "",
            "| measure | value | target |", "|---|---:|---:|",
            f"| sidecar RSS idle | {idle / mib:,.0f} MiB | |",
            f"| **peak RSS** | **{peak / mib:,.0f} MiB** | <= 1,024 MiB |",
            f"| per stream above idle | {per_stream / mib:.2f} MiB ({per_stream / MEMORY_TOKENS:.0f} B a token) | |",
            f"| bytes each agent received | {sum(received) / count:,.0f} | |", ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1024)
    count = parser.parse_args().streams
    text = "\n".join(asyncio.run(run(count))) + "\n"
    print(text)
    with open(os.path.join(HERE, "results", "memory.md"), "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
