"""Engine paths (issue 57): what MoE routed experts cost on disk, and what the option costs the token mode.

    python benchmarks/bench_engines.py [--rounds 3] [--seconds 4]

1. Bytes per token stored, a 64-layer top-8 MoE model (128 experts: ``uint8``; 384: ``uint16``): a
   rollout of 6 token-in turns, each sending its whole sequence back with 600 new prompt tokens,
   through a sidecar in front of the stand-in answering as vLLM with
   ``--enable-return-routed-experts``. With ``--capture-routed-experts`` (each call's new rows once,
   as ``.npy`` objects) against without (each line keeps the reply's base64 array of the whole
   sequence, as the agent received it), beside the raw floor (layers x top_k x item size).
2. The token mode's speed with the option on against off, side by side in one run: wrk's logprob
   stream (events/s, c=64) and 1 KB JSON calls (req/s, c=64) through sidecars in front of
   `fast_upstream.py` (which returns no routed experts: the option's cost on the calls that do
   not carry them), interleaved rounds, medians and the run's spread.

Prints markdown tables and writes them to benchmarks/results/engines.md. Nothing is asserted.
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

import aiohttp  # noqa: E402
import orjson  # noqa: E402

import bench_proxy as bench  # noqa: E402
from proxy.app import Settings, start_sidecar  # noqa: E402
from proxy.standin import start_stand_in  # noqa: E402
from proxy.standin.replies import ExpertRouting  # noqa: E402
from records import read_token_entries, trajectories  # noqa: E402

TURNS, NEW_TOKENS = 6, 600
TOKEN_MODE = ("--capture-tokens", "--capture-raw-stream", "on-failure")


def _size(directory: str, suffix: str = "") -> int:
    total = 0
    for root, _, names in os.walk(directory):
        total += sum(os.path.getsize(os.path.join(root, name)) for name in names if name.endswith(suffix))
    return total


async def _rollout(routing: ExpertRouting, routed_experts: bool) -> dict[str, float]:
    """One rollout through a fresh sidecar; bytes on disk and the trajectory's tokens."""
    work = tempfile.mkdtemp(prefix="mcc-engines-")
    upstream = await start_stand_in(routing=routing)
    sidecar = await start_sidecar(Settings(upstream=upstream.url, port=0, capture_dir=work, capture_tokens=True,
                                           capture_routed_experts=routed_experts, engine="vllm"))
    try:
        sequence: list[int] = []
        async with aiohttp.ClientSession() as http:
            for turn in range(TURNS):
                sequence += [1000 + (turn * NEW_TOKENS + i) % 30000 for i in range(NEW_TOKENS)]
                body = {"token_ids": sequence, "sampling_params": {"max_tokens": 32, "logprobs": 0}}
                async with http.post(f"{sidecar.url}/ng-rollout/moe/inference/v1/generate", data=orjson.dumps(body)) as reply:
                    generated = (await reply.json())["choices"][0]["token_ids"]
                sequence += generated
    finally:
        await sidecar.close()
        await upstream.close()
    tokens = len(trajectories(work, "moe").main.token_ids)  # type: ignore[union-attr]  # a chain was built
    experts = _size(os.path.join(work, "moe.experts"))
    lines = _size(work, ".capture.jsonl")
    stored_rows = sum((entry["routed_experts"] or {"shape": [0]})["shape"][0] for entry in read_token_entries(work, "moe"))
    shutil.rmtree(work, ignore_errors=True)
    return {"tokens": tokens, "experts": experts, "lines": lines, "rows": stored_rows}


def storage_table() -> list[str]:
    out = ["| model | option | tokens | rows stored | routed-expert objects (bytes) | capture lines (bytes) | "
           "bytes per token for routing | x raw floor |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for experts in (128, 384):
        routing = ExpertRouting(layers=64, top_k=8, experts=experts)
        floor = 64 * 8 * (1 if experts <= 256 else 2)
        on = asyncio.run(_rollout(routing, True))
        off = asyncio.run(_rollout(routing, False))
        base = off["lines"] - on["lines"]  # What the lines hold beyond the lines that name objects.
        for label, figures, routing_bytes in (("on (objects)", on, on["experts"]), ("off (in the lines)", off, base)):
            per_token = routing_bytes / figures["tokens"]
            dtype = "uint8" if routing.dtype == "|u1" else "uint16"
            out.append(f"| 64 layers, top-8, {experts} experts ({dtype}) | {label} | {figures['tokens']:,} | "
                       f"{figures['rows']:,} | {figures['experts']:,} | {figures['lines']:,} | {per_token:,.0f} | "
                       f"{per_token / floor:.2f} |")
    return out


def speed_table(rounds: int, seconds: int) -> list[str]:
    bench.ensure_tools()
    workdir = tempfile.mkdtemp(prefix="mcc-engines-wrk-")
    upstream = bench.start_upstream()
    modes = {"token mode": TOKEN_MODE, "token mode + --capture-routed-experts": (*TOKEN_MODE, "--capture-routed-experts")}
    try:
        figures = bench.interleaved_modes(upstream, modes, rounds, seconds, workdir)
    finally:
        upstream.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    out, med = bench.modes_table(figures, rounds, seconds)
    on, off = med["token mode + --capture-routed-experts"], med["token mode"]
    out += ["", f"on / off: JSON {on['json'] / off['json']:.2f}, logprob stream {on['logprob'] / off['logprob']:.2f}"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    args = parser.parse_args()
    lines = ["## Routed experts on disk", "", *storage_table(), "", "## The token mode with the option on and off", "",
             *speed_table(args.rounds, args.seconds)]
    bench.publish("engines", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
