"""The number nobody publishes (issue 76, part 4): what a capture proxy adds to a model call, with
token ids and logprobs on, at c=1, 10 and 64 -- side by side in one interleaved run.

    python benchmarks/bench_sweep.py [--rounds 3] [--seconds 4]

Servers, each in front of the same `fast_upstream.py`: the upstream itself (direct), nginx, the
naive capture proxy (`naive_capture_proxy.py`: aiohttp, raw bytes appended and fsynced, nothing
parsed), the sidecar with capture on, and the sidecar in the token capture mode. Workloads: 1 KB
JSON chat calls, and the vLLM-shaped logprob stream (256 events, a logprob entry and a token id in
every chunk, read to its end). wrk drives each at each concurrency, with ``--latency``.

Printed (and kept in benchmarks/results/sweep.md): per workload and concurrency, each server's
calls/s (events/s for the stream), its p50 and p99 per call, and what it adds to a direct call's
p50 and p99 -- medians of the interleaved rounds. Nothing is asserted: the machine is shared, so
only figures of one run are compared (docs/speed.md).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_proxy as bench  # noqa: E402

CONCURRENCIES = (1, 10, 64)
WORKLOADS = {"JSON 1 KB": bench.JSON_BODY, "logprob stream": bench.LOGPROB_BODY}
TOKEN_MODE = ("--capture-tokens", "--capture-raw-stream", "on-failure")
#: The name's tail for a sidecar on the pure-Python reference (``MCC_NO_EXTENSIONS=1``).
PURE_PYTHON = ", pure Python"
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def wrk_latency(port: int, concurrency: int, seconds: int, workdir: str, body: bytes) -> tuple[float, float, float]:
    """(calls/s, p50 s, p99 s) of one wrk run with ``--latency`` (each call: its whole reply)."""
    script = bench.wrk_post_script(workdir, body, "sweep")
    threads = min(2, concurrency)
    out = subprocess.run(["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{seconds}s", "--latency", "-s", script,
                          f"http://127.0.0.1:{port}/"], capture_output=True, text=True).stdout
    rate = float(next(line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec")))
    return rate, _percentile(out, "50%"), _percentile(out, "99%")


def _percentile(out: str, which: str) -> float:
    match = re.search(rf"^\s*{re.escape(which)}\s+([\d.]+)(us|ms|s|m)\s*$", out, flags=re.M)
    if match is None:
        raise RuntimeError(f"wrk printed no {which} latency:\n{out}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, action="append", help="only these (repeatable)")
    parser.add_argument("--workload", choices=list(WORKLOADS), action="append", help="only these (repeatable)")
    args = parser.parse_args()
    concurrencies = tuple(args.concurrency or CONCURRENCIES)
    workloads = {name: WORKLOADS[name] for name in args.workload or WORKLOADS}
    bench.ensure_tools()
    workdir = tempfile.mkdtemp(prefix="mcc-sweep-")
    upstream = bench.start_upstream()
    servers: dict[str, bench.Target] = {"direct": upstream, "nginx": bench.start_nginx(upstream, workdir),
                                        "naive capture proxy": bench.start_naive(upstream, os.path.join(workdir, "n"))}
    for name, extra in (("sidecar, capture on", ()), ("sidecar, token mode", TOKEN_MODE)):
        # With the compiled core and with the pure-Python reference (`capture._native`).
        for core, environment in (("", None), (PURE_PYTHON, {"MCC_NO_EXTENSIONS": "1"})):
            servers[name + core] = bench.start_sidecar(name + core, upstream, tempfile.mkdtemp(prefix="mcc-sweep-cap-"),
                                                       extra=extra, environment=environment)
    figures: dict[tuple[str, int, str], list[tuple[float, float, float]]] = {}
    try:
        for _ in range(args.rounds):
            for workload, body in workloads.items():
                for concurrency in concurrencies:
                    for name, target in servers.items():
                        figures.setdefault((workload, concurrency, name), []).append(
                            wrk_latency(target.port, concurrency, args.seconds, workdir, body))
    finally:
        for target in servers.values():
            target.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    text = report(args, figures, list(servers), workloads, concurrencies)
    if args.concurrency or args.workload:
        print(text)  # A part of the sweep: results/sweep.md keeps the whole one.
    else:
        bench.publish("sweep", text)


def report(args: argparse.Namespace, figures: dict[tuple[str, int, str], list[tuple[float, float, float]]],
           names: list[str], workloads: dict[str, bytes], concurrencies: tuple[int, ...]) -> str:
    def median(key: tuple[str, int, str], part: int) -> float:
        return statistics.median(values[part] for values in figures[key])

    lines = [f"{args.rounds} interleaved rounds of {args.seconds} s per cell (wrk --latency); medians of the rounds; "
             "p50 / p99 are of a whole call (a stream's: to its last byte); added = the server's minus direct's.", ""]
    for workload in workloads:
        rate_unit = "events/s" if workload == "logprob stream" else "calls/s"
        scale = bench.STREAM_EVENTS if workload == "logprob stream" else 1
        lines += [f"## {workload}", "", f"| c | server | {rate_unit} | p50 (ms) | p99 (ms) | added p50 (ms) | "
                  "added p99 (ms) |", "|---:|---|---:|---:|---:|---:|---:|"]
        for concurrency in concurrencies:
            direct = ((workload, concurrency, "direct"))
            for name in names:
                key = (workload, concurrency, name)
                p50, p99 = median(key, 1), median(key, 2)
                added = "" if name == "direct" else \
                    f"{(p50 - median(direct, 1)) * 1e3:+.2f} | {(p99 - median(direct, 2)) * 1e3:+.2f}"
                lines.append(f"| {concurrency} | {name} | {median(key, 0) * scale:,.0f} | {p50 * 1e3:.2f} | "
                             f"{p99 * 1e3:.2f} | {added or ' | '} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
