"""Prefix supply against issue 32's targets, on a real vLLM 0.32 (its CPU build, the vLLM tier's).

    python benchmarks/bench_supply.py [--quick]

1. The added latency of prefix supply per call: the second turn of a chat session (its parent
   resolved), through a sidecar with ``--supply-prefix`` and one without, interleaved, in front of
   the same vLLM; p50 and p90 of each and their difference (the three ``/tokenize`` renders, sent
   at once, and the splice).
2. The share of turns that extend their parent in a 20-turn session whose replies are sent back
   as text (the tiny model's text re-tokenizes differently: the natural prompts drift), with and
   without the flag.

``MCC_VLLM_URL`` points at a vLLM already running; else one is started (the vLLM tier's venv,
built by ``make vllm-conformance``); without one the bench says so and exits 0. Prints markdown
tables and writes them to benchmarks/results/supply.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import aiohttp  # noqa: E402
import orjson  # noqa: E402

from proxy import Settings, start_sidecar  # noqa: E402
from records import CaptureStore, read_token_records  # noqa: E402

_JSON = {"Content-Type": "application/json"}
_SYSTEM = {"role": "system", "content": "You are terse."}


def _body(messages: list[dict[str, Any]], model: str) -> bytes:
    return orjson.dumps({"model": model, "messages": messages, "max_tokens": 8, "temperature": 1.0, "seed": 7})


async def _turn(http: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]], model: str) -> tuple[float, str]:
    started = time.perf_counter()
    async with http.post(url, data=_body(messages, model), headers=_JSON) as reply:
        body = await reply.read()
    elapsed = time.perf_counter() - started
    return elapsed * 1000, orjson.loads(body)["choices"][0]["message"]["content"] or ""


async def _latencies(http, plain: str, supplied: str, model: str, rounds: int) -> dict[str, list[float]]:
    """The second turn's latency through each sidecar, interleaved (a fresh rollout each round)."""
    seen: dict[str, list[float]] = {"without": [], "with": []}
    for index in range(rounds):
        for name, base in (("without", plain), ("with", supplied)) if index % 2 else (("with", supplied), ("without", plain)):
            url = f"{base}/ng-rollout/lat-{name}-{index}/v1/chat/completions"
            messages = [_SYSTEM, {"role": "user", "content": "Write a small Python function."}]
            _, said = await _turn(http, url, messages, model)
            messages += [{"role": "assistant", "content": said}, {"role": "user", "content": "Again."}]
            elapsed, _ = await _turn(http, url, messages, model)
            if index >= 2:  # The first rounds warm both paths up.
                seen[name].append(elapsed)
    return seen


async def _session(http, base: str, rollout: str, model: str, turns: int) -> None:
    url = f"{base}/ng-rollout/{rollout}/v1/chat/completions"
    messages = [_SYSTEM, {"role": "user", "content": "Write a small Python function."}]
    for turn in range(turns):
        _, said = await _turn(http, url, messages, model)
        messages += [{"role": "assistant", "content": said}, {"role": "user", "content": f"Again ({turn})."}]


def _extending_share(directory: str, rollout: str) -> tuple[int, int]:
    records = read_token_records(CaptureStore(directory), rollout)
    later = records[1:]
    return sum(1 for index, record in enumerate(later) if record.extends == index), len(later)


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


async def run(vllm_url: str, quick: bool) -> list[str]:
    directory = tempfile.mkdtemp(prefix="mcc-bench-supply-")
    model = "tiny"
    plain = await start_sidecar(Settings(upstream=vllm_url, port=0, capture_dir=directory, capture_tokens=True))
    supplied = await start_sidecar(Settings(upstream=vllm_url, port=0, capture_dir=directory, capture_tokens=True,
                                            supply_prefix=True))
    try:
        async with aiohttp.ClientSession() as http:
            seen = await _latencies(http, plain.url, supplied.url, model, 12 if quick else 42)
            turns = 8 if quick else 20
            await _session(http, plain.url, "drift-without", model, turns)
            await _session(http, supplied.url, "drift-with", model, turns)
    finally:
        await plain.close()
        await supplied.close()
    try:
        shares = {name: _extending_share(directory, f"drift-{name}") for name in ("without", "with")}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    p50 = {name: statistics.median(values) for name, values in seen.items()}
    lines = [f"# Prefix supply on a real vLLM 0.32 (CPU build, tiny model), {len(seen['with'])} calls each", "",
             "## The second turn of a session (its parent resolved), interleaved, ms", "",
             "| sidecar | p50 | p90 |", "|---|---:|---:|"]
    for name in ("without", "with"):
        lines.append(f"| --capture-tokens{' --supply-prefix' if name == 'with' else ''} | {p50[name]:.2f} | "
                     f"{_pct(seen[name], 90):.2f} |")
    lines += ["", f"Added by prefix supply, p50: **{p50['with'] - p50['without']:.2f} ms** (target <= 5 ms).", "",
              f"## A {turns}-turn session whose replies are sent back as text", "",
              "| sidecar | turns extending their parent | share |", "|---|---:|---:|"]
    for name in ("without", "with"):
        extending, later = shares[name]
        lines.append(f"| {name} --supply-prefix | {extending} of {later} | {extending / later:.0%} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    quick = parser.parse_args().quick
    with contextlib.ExitStack() as stack:
        url = os.environ.get("MCC_VLLM_URL", "").rstrip("/")
        if not url:
            from tests.vllm_conformance.vllm_server import VllmUnavailable, running_vllm
            try:
                url = stack.enter_context(running_vllm())
            except VllmUnavailable as exc:
                print(f"bench_supply: skipped, no real vLLM here: {exc}")
                return
        lines = asyncio.run(run(url, quick))
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(HERE, "results", "supply.md"), "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
