"""`mcc report` on a 5,000-rollout directory (issue 16): time to write, the page's size, and how
long headless Chromium takes to load and draw it.

    python benchmarks/bench_report.py [--rollouts N] [--before DIR]

``--before DIR`` also measures the report of the project checked out at DIR (a previous release),
built and rendered the same way in the same run. Prints a markdown table (results/report.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from tests.capture_dirs import make_capture_dir  # noqa: E402
from tests.proxy.inspection.test_report_in_browser import Browser, open_page  # noqa: E402


def build(checkout: str, captures: str, output: str) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "proxy", "report", captures, "-o", output], cwd=checkout, check=True,
                   capture_output=True, timeout=3600)
    return time.perf_counter() - started


async def render(output: str, workdir: str) -> tuple[float, int]:
    from pathlib import Path
    async with Browser(Path(workdir)) as tools:
        started = time.perf_counter()
        await open_page(tools, output)
        sections = await tools.evaluate("document.querySelectorAll('section.rollout').length")
        return time.perf_counter() - started, sections


def measure(label: str, checkout: str, captures: str, workdir: str) -> str:
    output = os.path.join(workdir, f"{label}.html")
    seconds = build(checkout, captures, output)
    page = os.path.getsize(output)
    payload_dir = os.path.splitext(output)[0] + "_files"
    payloads = sum(os.path.getsize(os.path.join(payload_dir, f)) for f in os.listdir(payload_dir)) if os.path.isdir(payload_dir) else 0
    load, sections = asyncio.run(render(output, os.path.join(workdir, label + "-browser")))
    return (f"| {label} | {seconds:.1f} | {page / 1e6:.1f} | {payloads / 1e6:.1f} | {load:.1f} | {sections} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=5000)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--before", metavar="DIR", help="a checkout of an earlier version to measure beside this one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        captures = os.path.join(workdir, "captures")
        make_capture_dir(captures, rollouts=args.rollouts, calls=args.calls)
        rows = [measure("this version", ROOT, captures, workdir)]
        if args.before:
            rows.append(measure("before", args.before, captures, workdir))
    text = "\n".join([f"# mcc report on {args.rollouts:,} rollouts x {args.calls} calls", "",
                      "| version | write (s) | page (MB) | payloads beside it (MB) | Chromium: navigate to load (s) | rollouts drawn |",
                      "|---|---:|---:|---:|---:|---:|", *rows, ""])
    print(text)
    with open(os.path.join(HERE, "results", "report.md"), "w", encoding="utf-8") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
