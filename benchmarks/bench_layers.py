"""This checkout against another, side by side in one run: JSON calls **and** the logprob stream.

    python benchmarks/bench_layers.py --before DIR [--rounds 3] [--seconds 5] [--no-walk]

``DIR`` is a checkout of the commit to compare with (``git worktree add /tmp/before <commit>``).
A change to the call path is compared here before it lands (docs/speed.md): the layers work once
measured JSON calls only and could not see a 0.6x loss on the logprob stream (issue 55).

Interleaved rounds, each: nginx and the naive capture proxy (`naive_capture_proxy.py`), then the
sidecar of each checkout with capture on and in the token capture mode (each started fresh, in
front of the same `fast_upstream.py`):

- 1 KB JSON calls from wrk at c=64 (requests/s);
- a vLLM-shaped logprob stream (256 events, a logprob entry and a token id in every chunk, about
  80 KB written whole at once) read to its end by wrk at c=64 (events/s);
- the same stream from one keep-alive client at c=1: the time to its first byte over a direct
  call's (the stream arrives in one read: what a cut of the whole read before its first event
  would cost).

Then each checkout's walk of one call and loop CPU per call (`trace_call.py`, run from that
checkout), alternately (``--no-walk`` leaves it out). Prints markdown tables: medians, the run's
own spread (min-max), and the ratios. Nothing is asserted: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_proxy as bench  # noqa: E402

AFTER = os.path.dirname(HERE)
TOKEN_MODE = ("--capture-tokens", "--capture-raw-stream", "on-failure")
MODES = {"capture on": (), "token mode": TOKEN_MODE}


def sidecar(tree: str, upstream: bench.Target, capture_dir: str | None, name: str,
            extra: tuple[str, ...] = (), workers: int = 1) -> bench.Target:
    """A sidecar run from ``tree``'s code: its directory first on the path and the working directory
    (``python -m`` and the capture process's ``python -c`` put the working directory first)."""
    saved, here = os.environ.get("PYTHONPATH"), os.getcwd()
    os.environ["PYTHONPATH"] = tree if not saved else f"{tree}{os.pathsep}{saved}"
    os.chdir(tree)
    try:
        return bench.start_sidecar(name, upstream, capture_dir, workers=workers, extra=extra)
    finally:
        os.chdir(here)
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def walk(tree: str, calls: int) -> list[str]:
    script = os.path.join(tree, "benchmarks", "trace_call.py")
    if not os.path.exists(script):
        shutil.copy(os.path.join(HERE, "trace_call.py"), script)
    done = subprocess.run([sys.executable, script, "--calls", str(calls)], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": tree}, cwd=tree)
    return [line for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line and "case" not in line]


def measure(target: bench.Target, seconds: int, workdir: str, ttft_calls: int, into: dict[str, list[float]]) -> None:
    """Every figure of one server, into ``into`` (key -> one value per round)."""
    into.setdefault("json", []).append(bench.wrk_rps(target.port, 64, seconds, workdir))
    into.setdefault("logprob", []).append(bench.wrk_events(target.port, 64, seconds, workdir, bench.LOGPROB_BODY))
    ttfts, _ = asyncio.run(bench.sequential(target.port, bench.LOGPROB_BODY, ttft_calls))
    into.setdefault("ttft", []).append(statistics.median(ttfts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="a checkout of the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--ttft-calls", type=int, default=300)
    parser.add_argument("--calls", type=int, default=1500, help="sequential calls of each walk's CPU figure")
    parser.add_argument("--no-walk", action="store_true", help="leave out trace_call.py's walk and loop CPU")
    args = parser.parse_args()
    bench.ensure_tools()
    before = os.path.abspath(args.before)
    figures: dict[str, dict[str, list[float]]] = {}
    workdir = tempfile.mkdtemp(prefix="mcc-layers-")
    upstream = bench.start_upstream()
    nginx = bench.start_nginx(upstream, workdir)
    naive = bench.start_naive(upstream, os.path.join(workdir, "naive"))
    direct_ttft: list[float] = []
    try:
        for _ in range(args.rounds):
            ttfts, _ = asyncio.run(bench.sequential(upstream.port, bench.LOGPROB_BODY, args.ttft_calls))
            direct_ttft.append(statistics.median(ttfts))
            for name, target in (("nginx", nginx), ("naive capture proxy", naive)):
                measure(target, args.seconds, workdir, args.ttft_calls, figures.setdefault(name, {}))
            for label, tree in (("before", before), ("after", AFTER)):
                for mode, extra in MODES.items():
                    name = f"{label}, {mode}"
                    capture_dir = tempfile.mkdtemp(prefix="mcc-layers-cap-")
                    target = sidecar(tree, upstream, capture_dir, name, extra)
                    try:
                        measure(target, args.seconds, workdir, args.ttft_calls, figures.setdefault(name, {}))
                    finally:
                        target.stop()
                        shutil.rmtree(capture_dir, ignore_errors=True)
    finally:
        naive.stop()
        nginx.stop()
        upstream.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    report(args, figures, statistics.median(direct_ttft))
    if not args.no_walk:
        walks: dict[str, list[list[str]]] = {label: [] for label in ("before", "after")}
        for _ in range(2):
            for label, tree in (("before", before), ("after", AFTER)):
                walks[label].append(walk(tree, args.calls))
        print("\nThe walk of one warm streamed chat call, and the loop's CPU per call (`trace_call.py`), two runs each\n")
        print("| checkout | case | calls | functions | files | hops | proxy/training calls | loop CPU per call (µs) |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for label, runs in walks.items():
            for rows in runs:
                for row in rows:
                    print(f"| {label} {row}")


def report(args: argparse.Namespace, figures: dict[str, dict[str, list[float]]], direct_ttft: float) -> None:
    med = lambda name, key: statistics.median(figures[name][key])  # noqa: E731
    spread = lambda name, key, scale=1.0: (f"{min(figures[name][key]) * scale:,.0f} - "  # noqa: E731
                                           f"{max(figures[name][key]) * scale:,.0f}")
    print(f"{args.rounds} interleaved rounds of {args.seconds} s, wrk at c=64; medians, the run's spread (min - max)\n")
    print("| server | JSON 1 KB req/s | x nginx | logprob stream events/s | x naive | "
          "stream in one read: added TTFT (ms) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in figures:
        print(f"| {name} | {med(name, 'json'):,.0f} ({spread(name, 'json')}) | {med(name, 'json') / med('nginx', 'json'):.3f} "
              f"| {med(name, 'logprob'):,.0f} ({spread(name, 'logprob')}) "
              f"| {med(name, 'logprob') / med('naive capture proxy', 'logprob'):.2f} "
              f"| {(med(name, 'ttft') - direct_ttft) * 1000:.2f} |")
    print("\n| mode | after / before: JSON req/s | after / before: logprob events/s | added TTFT after - before (ms) |")
    print("|---|---:|---:|---:|")
    for mode in MODES:
        after, before = f"after, {mode}", f"before, {mode}"
        print(f"| {mode} | {med(after, 'json') / med(before, 'json'):.2f} | {med(after, 'logprob') / med(before, 'logprob'):.2f} "
              f"| {(med(after, 'ttft') - med(before, 'ttft')) * 1000:+.2f} |")


if __name__ == "__main__":
    main()
