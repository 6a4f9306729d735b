"""A slow redaction hook is felt by its own call only (issue 73, point 2; docs/privacy.md): the
latency of the other calls of a burst of 12 when the hook stalls past its budget on one of them,
beside a hook that never stalls and no hook at all, side by side in one run (interleaved rounds,
one process: the stand-in, three sidecars, the client).

    python benchmarks/bench_slow_hook.py [--rounds 20]

Prints a markdown table (p50 / p99 of the other 11 calls' latency, ms; their ratio to no hook) and
writes benchmarks/results/slow_hook.md. Nothing is asserted: the machine is shared. Before the
per-line pool, each line waited behind the stalled one's full budget (issue 73 measured 7 s for 11
replies with a 0.5 s budget).
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

import logging  # noqa: E402

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from proxy import Settings, start_sidecar, start_stand_in  # noqa: E402

BURST, BUDGET, STALL = 12, 0.5, 2.0


def stalling_hook(text: str) -> str:
    """Past any budget on a text that says STALL (a scanner service that hangs), else at once."""
    if "STALL" in text:
        time.sleep(STALL)
    return text.replace("ACME", "[ACME]")


def quick_hook(text: str) -> str:
    return text.replace("ACME", "[ACME]")


async def _burst(http: aiohttp.ClientSession, url: str, round_index: int, stall: bool) -> list[float]:
    async def call(index: int) -> tuple[bool, float]:
        stalled = stall and index == 0
        body = {"model": "m", "messages": [{"role": "user", "content": ("STALL " if stalled else "") + f"ACME-{index}"}]}
        started = time.perf_counter()
        async with http.post(f"{url}/ng-rollout/r{round_index}-{index}/v1/chat/completions", data=orjson.dumps(body),
                             headers={"Content-Type": "application/json"}) as reply:
            await reply.read()
        return stalled, (time.perf_counter() - started) * 1000.0
    results = await asyncio.gather(*(call(index) for index in range(BURST)))
    return [ms for stalled, ms in results if not stalled]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def main(rounds: int) -> str:
    stand_in = await start_stand_in()
    root = tempfile.mkdtemp(prefix="mcc-slow-hook-")
    configs = {  # Per sidecar: its settings, and whether one call of each burst stalls the hook.
        "no hook": ({}, False),
        "hook, never stalls": ({"redact_hook": f"{__name__}:quick_hook"}, False),
        "hook, stalls on 1 of 12": ({"redact_hook": f"{__name__}:stalling_hook"}, True),
    }
    sidecars = {name: await start_sidecar(Settings(upstream=stand_in.url, port=0, capture_dir=os.path.join(root, str(i)),
                                                   redact_hook_budget=BUDGET, **extra))
                for i, (name, (extra, _)) in enumerate(configs.items())}
    latencies: dict[str, list[float]] = {name: [] for name in configs}
    async with aiohttp.ClientSession() as http:
        for sidecar in sidecars.values():  # Warm: connections, caches, the first line of each rollout.
            await _burst(http, sidecar.url, -1, stall=False)
        for round_index in range(rounds):
            for name, sidecar in sidecars.items():
                latencies[name] += await _burst(http, sidecar.url, round_index, stall=configs[name][1])
    for sidecar in sidecars.values():
        await sidecar.close()
    await stand_in.close()
    base50, base99 = _percentile(latencies["no hook"], 0.5), _percentile(latencies["no hook"], 0.99)
    lines = [f"Bursts of {BURST} chat calls through the sidecar to the stand-in, {rounds} rounds interleaved, "
             f"--redact-hook-budget {BUDGET} s; the stalling hook sleeps {STALL} s on one call of each burst "
             "(that call is written metrics-only); the table is the other calls' latency.", "",
             "| hook | calls | p50 ms | p99 ms | p50 / no hook | p99 / no hook |", "|---|---:|---:|---:|---:|---:|"]
    for name, values in latencies.items():
        p50, p99 = _percentile(values, 0.5), _percentile(values, 0.99)
        lines.append(f"| {name} | {len(values)} | {p50:.1f} | {p99:.1f} | {p50 / base50:.2f}x | {p99 / base99:.2f}x |")
    lines += ["", f"mean of the others with the stalling hook: {statistics.mean(latencies['hook, stalls on 1 of 12']):.1f} ms "
              f"(a budget is {BUDGET * 1000:.0f} ms)"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    logging.getLogger("mcc").setLevel(logging.ERROR)  # Each stalled line's warning: expected here.
    table = asyncio.run(main(parser.parse_args().rounds))
    print(table)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "slow_hook.md"), "w", encoding="utf-8") as handle:
        handle.write(table)
