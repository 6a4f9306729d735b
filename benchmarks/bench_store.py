"""Storage past one node (issue 46), side by side in one run:

    python benchmarks/bench_store.py [--rollouts 100000] [--seconds 5] [--rounds 5]

1. Files: the same calls (one JSON call per rollout, then a second round) through a sidecar with
   the per-rollout layout and through one with writer segments and a ``segments://`` store; files
   and inodes each leaves, counted (a run of 100,000 rollouts by default; per-rollout files grow
   with the rollouts, segments with the bytes).
2. Load: 1 KB JSON calls from wrk at c=64 over 64 rollouts, interleaved rounds: the per-rollout
   layout against segments (requests/s), while the store's upload lag (`/-/ready`'s
   ``upload_lag``) is sampled every 0.25 s: its largest and median seconds and bytes; and
   segments whose store refuses every upload (the appends alone, without the upload's read, hash
   and copy on the same disk).

Nothing is asserted: the machine is shared. Prints markdown tables; writes results/store.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_proxy as bench  # noqa: E402


def count_files(root: str) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


async def one_call_per_rollout(port: int, rollouts: int) -> None:
    import aiohttp
    async with aiohttp.ClientSession() as http:
        semaphore = asyncio.Semaphore(32)

        async def call(number: int) -> None:
            async with semaphore:
                async with http.post(f"http://127.0.0.1:{port}/ng-rollout/run-{number}/v1/chat/completions",
                                     data=bench.JSON_BODY, headers={"Content-Type": "application/json"}) as reply:
                    await reply.read()
        await asyncio.gather(*(call(n) for n in range(rollouts)))


def ready(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as reply:
        return json.loads(reply.read())


def files_table(upstream: bench.Target, workdir: str, rollouts: int) -> list[str]:
    rows = []
    for layout, tokens in (("per-rollout", False), ("segments", False), ("per-rollout", True), ("segments", True)):
        name = f"{layout}{'-tokens' if tokens else ''}"
        spool, store = os.path.join(workdir, f"{name}-dir"), os.path.join(workdir, f"{name}-store")
        extra = (("--capture-store", f"segments://{store}", "--segment-max-age", "1") if layout == "segments" else ())
        extra += ("--capture-tokens",) if tokens else ()
        sidecar = bench.start_sidecar(name, upstream, spool, extra=extra)
        for _ in range(2):
            asyncio.run(one_call_per_rollout(sidecar.port, rollouts))
        sidecar.stop()
        local, shared = count_files(spool), count_files(store) if layout == "segments" else count_files(spool)
        rows.append(f"| {layout} | {'on' if tokens else 'off'} | {rollouts:,} | {2 * rollouts:,} | {local:,} | "
                    f"{shared:,} | {f'{shared * 100_000 // rollouts:,}' if layout == 'per-rollout' else f'about {shared}'} |")
    return ["| layout | token mode | rollouts | calls | files on the node | files in the shared place | "
            "shared files at 100,000 rollouts |", "|---|---|---:|---:|---:|---:|---:|", *rows, "",
            "The shared place: the capture dir on the shared volume (per-rollout), the store (segments). Per-rollout: "
            "a file per rollout, and with the token mode up to four more (`.tokens.jsonl`, `.tokens.lock`, "
            "`.tokens.intents`, `.tokens.state.json`). Segments: objects per sealed segment and per token bundle "
            "(here sealed each second: in a run, every 64 MiB or 60 s), whatever the number of rollouts; the token "
            "mode's per-rollout files stay on the node's own spool (its lineage reads them), shipped to the store "
            "in bundles."]


def _cpu_of(stat_path: str) -> float:
    try:
        with open(stat_path, encoding="ascii") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime (stat's 14th, 15th).


def _kernel_writeback() -> float:
    """CPU seconds of the kernel's writeback and journal threads (kworker, jbd2): a ``syncfs``
    has them write the pages, where an ``fsync`` writes them in the caller's own time."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm", encoding="ascii") as handle:
                    name = handle.read()
            except OSError:
                continue
            if name.startswith(("kworker", "jbd2")):
                total += _cpu_of(f"/proc/{entry}/stat")
    return total


def cpu_parts(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of the sidecar's parts: its event loop (the main thread), its
    capture process (the appends and fsyncs), the kernel's writeback of them, and its uploader
    process (with a store)."""
    loop = _cpu_of(f"/proc/{pid}/task/{pid}/stat")
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    parts = {"loop": loop, "capture": 0.0, "kernel": _kernel_writeback(), "uploader": 0.0}
    for child in children:
        try:
            with open(f"/proc/{child}/cmdline", "rb") as handle:
                uploader = b"_upload_process" in handle.read()
        except OSError:
            continue
        parts["uploader" if uploader else "capture"] += _cpu_of(f"/proc/{child}/stat")
    return parts


def load_table(upstream: bench.Target, workdir: str, rounds: int, seconds: int) -> list[str]:
    results: dict[str, list[float]] = {"per-rollout": [], "segments": [], "segments, sealed and uploaded each second": [],
                                       "segments, sealed each second, uploads refused": []}
    cpu: dict[str, list[dict[str, float]]] = {layout: [] for layout in results}  # CPU µs per call, by part.
    refusing = os.path.join(workdir, "not-a-directory")
    with open(refusing, "w", encoding="ascii") as handle:
        handle.write("a store whose path is a file refuses every upload")
    lag_seconds: list[float] = []
    lag_bytes: list[int] = []
    for round_ in range(rounds):
        for layout in results:
            store = f"segments://{refusing}" if "refused" in layout else f"segments://{workdir}/load-store-{round_}"
            extra = ("--capture-store", store) if layout.startswith("segments") else ()
            if "each second" in layout:  # Else the defaults: sealed at 64 MiB or 60 s.
                extra += ("--segment-max-age", "1")
            spool = os.path.join(workdir, f"load-{layout.replace(', ', '-').replace(' ', '-')}-{round_}")
            sidecar = bench.start_sidecar(layout, upstream, spool, extra=extra)
            stop = threading.Event()

            def sample(port: int = sidecar.port, stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    try:
                        lag = ready(port).get("upload_lag")
                    except OSError:
                        lag = None
                    if lag is not None:
                        lag_seconds.append(lag["oldest_seconds"])
                        lag_bytes.append(lag["bytes"])
                    time.sleep(0.25)
            sampler = threading.Thread(target=sample, daemon=True) if "uploaded each second" in layout else None
            if sampler is not None:
                sampler.start()
            before = cpu_parts(sidecar.process.pid)
            rps = bench.wrk_rps(sidecar.port, 64, seconds, workdir)
            after = cpu_parts(sidecar.process.pid)
            results[layout].append(rps)
            cpu[layout].append({part: (after[part] - before[part]) * 1e6 / (rps * seconds) for part in after})
            stop.set()
            if sampler is not None:
                sampler.join()
            sidecar.stop()
    lines = [f"JSON 1 KB, wrk c=64, {rounds} interleaved rounds of {seconds} s (requests/s). Segments at the defaults "
             "(sealed at 64 MiB or 60 s: here by size, every few seconds), and sealed each second (a new file, its "
             "seal and its upload every second: the worst case), with uploads to a store on the same disk or refused.",
             "", "| layout | median | min - max | x per-rollout (median of medians) | x per-rollout (median of each "
             "round's ratio) |", "|---|---:|---:|---:|---:|"]
    base = statistics.median(results["per-rollout"])
    for layout, values in results.items():
        paired = statistics.median(value / first for value, first in zip(values, results["per-rollout"]))
        lines.append(f"| {layout} | {statistics.median(values):,.0f} | {min(values):,.0f} - {max(values):,.0f} | "
                     f"{statistics.median(values) / base:.3f} | {paired:.3f} |")
    lines += ["", "CPU per call (user + system, µs; median over the rounds): the hot path is what a call waits for, "
              "the event loop, the capture process and the kernel's writeback of its lines (kworker, jbd2: a "
              "`syncfs` has them write the pages an `fsync` writes in the capture process's own time); the "
              "uploader runs beside it, in a process of its own. Steadier than requests/s on a shared machine.", "",
              "| layout | event loop | capture process | kernel writeback | hot path | x per-rollout (hot path) | "
              "uploader process |", "|---|---:|---:|---:|---:|---:|---:|"]
    hot = {layout: statistics.median(run["loop"] + run["capture"] + run["kernel"] for run in runs)
           for layout, runs in cpu.items()}
    for layout, runs in cpu.items():
        def median(part: str, runs: list = runs) -> float:
            return statistics.median(run[part] for run in runs)
        lines.append(f"| {layout} | {median('loop'):.1f} | {median('capture'):.1f} | {median('kernel'):.1f} | "
                     f"{hot[layout]:.1f} | {hot[layout] / hot['per-rollout']:.3f} | {median('uploader'):.1f} |")
    if lag_seconds:
        lines += ["", f"Upload lag under that load (segments sealed at 1 s, {len(lag_seconds)} samples of /-/ready): "
                  f"oldest unsent segment median {statistics.median(lag_seconds):.2f} s, largest {max(lag_seconds):.2f} s; "
                  f"unsent bytes median {statistics.median(lag_bytes):,.0f}, largest {max(lag_bytes):,}."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="200 rollouts, one round of 2 s")
    args = parser.parse_args()
    if args.quick:
        args.rollouts, args.seconds, args.rounds = 200, 2, 1
    bench.ensure_tools()
    upstream = bench.start_upstream()
    try:
        with tempfile.TemporaryDirectory() as workdir:
            table = ["# Storage past one node (issue 46): the per-rollout layout against writer segments, one run", "",
                     f"`python benchmarks/bench_store.py --rollouts {args.rollouts} --seconds {args.seconds} --rounds "
                     f"{args.rounds}`, {time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} cores, "
                     "wrk, the `fast_upstream.py` upstream, a `segments://` store on the same disk.", "",
                     *files_table(upstream, workdir, args.rollouts), "", *load_table(upstream, workdir, args.rounds,
                                                                                     args.seconds)]
    finally:
        upstream.stop()
    text = "\n".join(table) + "\n"
    print(text)
    if not args.quick:
        with open(os.path.join(HERE, "results", "store.md"), "w", encoding="utf-8") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
