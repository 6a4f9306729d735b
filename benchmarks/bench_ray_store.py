"""`records.ray_dataset` over one run of a million calls, from writer segments in a store and from
per-rollout files, side by side (issue 46).

    python benchmarks/bench_ray_store.py [--rollouts 100000] [--calls 10] [--rounds 2] [--cpus 2]

The same calls are written both ways: Gym's layout (one ``<rollout_id>.capture.jsonl`` per rollout)
and a ``segments://`` store as three sidecars leave it (each rollout pinned to one writer, every
tenth re-pinned so its calls alternate between two; each writer's lines in the order its rollouts'
calls completed, cut into 64 MiB segments, uploaded by the real `Uploader`, manifests and all).
Then, on a local Ray with ``--cpus`` CPUs, taking turns round after round (this machine's speed
drifts), ``ray_dataset(..., kind="calls")`` is planned (the files listed, or the manifests read
and every line placed: `plan_segment_reads`) and read whole (the rows handed to the driver as
Arrow batches). Both give the same rows (checked: rollout, call index, ``completed_at``, call id).

Prints a markdown table and writes it to results/ray_store.md. The ratio, not the absolute time, is
the figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import ray  # noqa: E402

from capture.journal import Uploader  # noqa: E402
from records import ray_dataset  # noqa: E402
from tests.capture_dirs import chat_line  # noqa: E402

WRITERS = ("node-1.1.aaaa", "node-2.1.bbbb", "node-3.1.cccc")
SEGMENT_BYTES = 64 * 1024 * 1024


def rollout_lines(rollout: int, calls: int) -> list[bytes]:
    """One rollout's calls: every 10th a 500, every 5th a tool call, every 4th cut by length (as
    `tests.capture_dirs.make_capture_dir`), its clock its own."""
    started = 1767225600.0 + rollout * 0.001
    return [chat_line(i, status=500 if i % 10 == 9 else 200, error="upstream_error" if i % 10 == 9 else None,
                      finish="length" if i % 4 == 0 else "stop", tool_arguments='{"q": "x"}' if i % 5 == 0 else None,
                      started=started).rstrip(b"\n") for i in range(calls)]


def write_both(work: str, rollouts: int, calls: int) -> tuple[str, str, dict[str, float]]:
    """The run as per-rollout files and as a segments store; (directory, store URL, timings)."""
    directory, spool, url = (os.path.join(work, "files"), os.path.join(work, "spool"),
                             f"segments://{os.path.join(work, 'store')}")
    os.makedirs(directory)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    lines = [rollout_lines(r, calls) for r in range(rollouts)]
    names = [f"rollout-{r:06d}" for r in range(rollouts)]
    for name, rollout in zip(names, lines):
        with open(os.path.join(directory, name + ".capture.jsonl"), "wb") as handle:
            handle.write(b"".join(line + b"\n" for line in rollout))
    timings["files written (s)"] = time.perf_counter() - started
    started = time.perf_counter()
    for w, writer in enumerate(WRITERS):
        segment_dir = os.path.join(spool, "segments", writer)
        os.makedirs(segment_dir)
        sequence, pieces, size = 1, [], 0

        def seal(segment_dir: str = segment_dir) -> None:
            nonlocal sequence, pieces, size
            with open(os.path.join(segment_dir, f"{sequence:010d}.sealed"), "wb") as handle:
                handle.write(b"".join(pieces))
            sequence, pieces, size = sequence + 1, [], 0

        for i in range(calls):  # The rollouts run side by side: each writer's lines by completion.
            for r in range(rollouts):
                repinned = r % 10 == 0
                owner = (r + i) % len(WRITERS) if repinned else r % len(WRITERS)
                if owner != w:
                    continue
                piece = names[r].encode() + b"\t" + lines[r][i] + b"\n"
                pieces.append(piece)
                size += len(piece)
                if size >= SEGMENT_BYTES:
                    seal()
        if pieces:
            seal()
    Uploader(spool, url).upload_all()
    timings["segments written and uploaded (s)"] = time.perf_counter() - started
    return directory, url, timings


def read(source: str) -> tuple[float, float, int]:
    """(seconds to plan, seconds to read, rows) of ``ray_dataset(source, kind="calls")``."""
    started = time.perf_counter()
    dataset = ray_dataset(source, kind="calls")
    planned = time.perf_counter()
    rows = sum(batch.num_rows for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None))
    return planned - started, time.perf_counter() - planned, rows


def rows_of(source: str) -> list[tuple]:
    keys = ["rollout_id", "call_index", "completed_at", "model_call_id", "status_code"]
    found: list[tuple] = []
    for batch in ray_dataset(source, kind="calls").iter_batches(batch_format="pyarrow", batch_size=None):
        columns = [batch.column(key).to_pylist() for key in keys]
        found.extend(zip(*columns))
    return sorted(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "ray_store.md"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="mcc-bench-ray-store-")
    os.environ["MCC_STORE_CACHE"] = os.path.join(work, "store-cache")
    try:
        directory, url, timings = write_both(work, args.rollouts, args.calls)
        files = len(os.listdir(directory))
        store_root = url[len("segments://"):]
        objects = sum(len(names) for _, _, names in os.walk(store_root))
        segments = sum(len(names) for _, _, names in os.walk(os.path.join(store_root, "segments")))
        size = sum(os.path.getsize(os.path.join(directory, name)) for name in os.listdir(directory))
        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1", runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
        from ray.data import DataContext
        DataContext.get_current().enable_progress_bars = False
        read(url)  # Warm-up: Ray's workers start once.
        results: dict[str, list[tuple[float, float, int]]] = {"files": [], "segments": []}
        for _ in range(args.rounds):
            results["files"].append(read(directory))
            results["segments"].append(read(url))
        calls = args.rollouts * args.calls
        assert all(rows == calls for runs in results.values() for *_, rows in runs), results
        same = rows_of(directory) == rows_of(url)
        assert same, "the two layouts' rows differ"
        ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def best(layout: str, which: int) -> float:
        return min(run[which] for run in results[layout])

    def total(run: tuple[float, float, int]) -> float:
        return run[0] + run[1]

    ratio = statistics.median(total(f) / total(s) for f, s in zip(results["files"], results["segments"]))
    table = [
        f"# records.ray_dataset(kind=\"calls\") over {calls:,} calls ({args.rollouts:,} rollouts x {args.calls}), "
        f"{args.cpus} Ray CPUs: segments in a store vs per-rollout files, the same run",
        "",
        f"Lines: {size / 1e6:,.0f} MB. Per-rollout layout: {files:,} files. Store: {segments} segments from "
        f"{len(WRITERS)} writers (every tenth rollout's calls alternating between two), {objects} objects with "
        "their manifests. Rows equal both ways (rollout, call index, completed_at, call id, status): "
        f"{'yes' if same else 'NO'}.",
        "",
        f"| source | plan (s, best of {args.rounds}) | read (s, best) | plan + read (s, best) | calls/s | "
        "files/segments read |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for layout, source, count in (("files", "per-rollout files (a directory)", files),
                                  ("segments", "writer segments (a segments:// store)", segments)):
        whole = min(total(run) for run in results[layout])
        table.append(f"| {source} | {best(layout, 0):.2f} | {best(layout, 1):.2f} | {whole:.2f} | "
                     f"{calls / whole:,.0f} | {count:,} |")
    table += ["", f"Median over rounds of (files' plan + read) / (segments' plan + read): **{ratio:.2f}x**.", "",
              "Writing the run: " + ", ".join(f"{key} {value:.1f}" for key, value in timings.items()) + ".", ""]
    text = "\n".join(table)
    print(text)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
