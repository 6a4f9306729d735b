"""This checkout against another, side by side in one run (issue 43: the layers must not slow a call).

    python benchmarks/bench_layers.py --before DIR [--rounds 3] [--seconds 5]

``DIR`` is a checkout of the commit to compare with (``git worktree add /tmp/before <commit>``).
Interleaved rounds, each: nginx, then the sidecar of each checkout with capture on and off, 1 KB
JSON calls from wrk at c=64 (requests/s), every sidecar in front of the same `fast_upstream.py`.
Then each checkout's walk of one call and loop CPU per call (`trace_call.py`, run from that
checkout), alternately. Prints a markdown table: medians, the run's own spread (min-max), and the
ratios to nginx. Nothing is asserted: the machine is shared.
"""

from __future__ import annotations

import argparse
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


def sidecar(tree: str, upstream: bench.Target, capture_dir: str | None, name: str) -> bench.Target:
    """A sidecar run from ``tree``'s code: its directory first on the path and the working directory
    (``python -m`` and the capture process's ``python -c`` put the working directory first)."""
    saved, here = os.environ.get("PYTHONPATH"), os.getcwd()
    os.environ["PYTHONPATH"] = tree if not saved else f"{tree}{os.pathsep}{saved}"
    os.chdir(tree)
    try:
        return bench.start_sidecar(name, upstream, capture_dir)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="a checkout of the commit to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=1500, help="sequential calls of each walk's CPU figure")
    args = parser.parse_args()
    bench.ensure_tools()
    before = os.path.abspath(args.before)
    rps: dict[str, list[float]] = {}
    workdir = tempfile.mkdtemp(prefix="mcc-layers-")
    upstream = bench.start_upstream()
    nginx = bench.start_nginx(upstream, workdir)
    try:
        for _ in range(args.rounds):
            rps.setdefault("nginx", []).append(bench.wrk_rps(nginx.port, 64, args.seconds, workdir))
            for label, tree in (("before", before), ("after", AFTER)):
                for capture in (True, False):
                    name = f"{label}, capture {'on' if capture else 'off'}"
                    capture_dir = tempfile.mkdtemp(prefix="mcc-layers-cap-") if capture else None
                    target = sidecar(tree, upstream, capture_dir, name)
                    try:
                        rps.setdefault(name, []).append(bench.wrk_rps(target.port, 64, args.seconds, workdir))
                    finally:
                        target.stop()
                        if capture_dir:
                            shutil.rmtree(capture_dir, ignore_errors=True)
    finally:
        nginx.stop()
        upstream.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    walks = {label: [] for label in ("before", "after")}
    for _ in range(2):
        for label, tree in (("before", before), ("after", AFTER)):
            walks[label].append(walk(tree, args.calls))
    nginx_median = statistics.median(rps["nginx"])
    print(f"JSON 1 KB, wrk c=64, {args.rounds} interleaved rounds of {args.seconds} s (requests/s)\n")
    print("| server | median | min - max | x nginx (median) |")
    print("|---|---:|---:|---:|")
    for name, values in rps.items():
        print(f"| {name} | {statistics.median(values):,.0f} | {min(values):,.0f} - {max(values):,.0f} | "
              f"{statistics.median(values) / nginx_median:.3f} |")
    print("\nThe walk of one warm streamed chat call, and the loop's CPU per call (`trace_call.py`), two runs each\n")
    print("| checkout | case | calls | functions | files | hops | proxy/training calls | loop CPU per call (µs) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for label, runs in walks.items():
        for rows in runs:
            for row in rows:
                print(f"| {label} {row}")


if __name__ == "__main__":
    main()
