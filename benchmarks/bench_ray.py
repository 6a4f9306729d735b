"""`records.ray_dataset` against `records.read_token_records` on the same files (issue 24).

    python benchmarks/bench_ray.py [--rollouts N] [--calls C] [--tokens T] [--cpus 2]

1. Token rows/s: the whole directory read as ``kind="tokens"`` on a local Ray with ``--cpus``
   CPUs (rows handed to the driver as Arrow batches), beside `read_token_records` over every
   rollout in this one process. Best of 3 each, after one warm-up read (Ray's workers started);
   Ray Data's default context, and with its per-operator CPU reservation off.
2. Peak RSS of a read task (a fresh worker process reading the largest group of files the
   dataset would give one task) with the directory at 1x and at 10x its size.

Prints a markdown table and writes it to results/ray.md. The ratio, not the absolute rate, is
the figure: both sides run in the same run on the same machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import ray  # noqa: E402

from records import CaptureStore, capture_files, ray_dataset, read_token_records  # noqa: E402
from records._datasets import group_files, read_group  # noqa: E402
from tests.capture_dirs import make_token_dir  # noqa: E402


def in_one_process(directory: str) -> tuple[float, int, int]:
    """(seconds, rows, token ids + logprobs) of read_token_records over every rollout."""
    store = CaptureStore(directory)
    started = time.perf_counter()
    rows = values = 0
    for rollout_id in store.rollout_ids():
        for record in read_token_records(store, rollout_id):
            rows += 1
            values += sum(len(v or ()) for v in (record.prompt_token_ids, record.generation_token_ids,
                                                  record.generation_log_probs))
    return time.perf_counter() - started, rows, values


def read_tasks_in_one_process(directory: str) -> tuple[float, int]:
    """The dataset's own read (Arrow blocks, the same work a Ray task does) over every file, here."""
    started = time.perf_counter()
    rows = sum(table.num_rows for table in read_group([path for path, _ in capture_files(directory)], "tokens"))
    return time.perf_counter() - started, rows


def on_ray(directory: str) -> tuple[float, int]:
    started = time.perf_counter()
    rows = 0
    for batch in ray_dataset(directory, kind="tokens").iter_batches(batch_format="pyarrow", batch_size=None):
        rows += batch.num_rows
    return time.perf_counter() - started, rows


@ray.remote(max_calls=1)  # A fresh worker process per call: its peak RSS is this task's.
def peak_rss_of_a_read_task(paths: list[str]) -> tuple[int, int]:
    import resource

    rows = sum(table.num_rows for table in read_group(paths, "tokens"))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, rows


def largest_group(directory: str, cpus: int) -> tuple[list[str], int]:
    groups = group_files(capture_files(directory), parallelism=cpus * 4)
    group = max(groups, key=lambda g: sum(size for _, size in g))
    return [path for path, _ in group], sum(size for _, size in group)


def grow(directory: str, times: int) -> None:
    """Make the directory ``times`` as big: copies of every rollout under new ids."""
    originals = [name for name in os.listdir(directory)]
    for copy in range(1, times):
        for name in originals:
            shutil.copyfile(os.path.join(directory, name), os.path.join(directory, f"x{copy}-{name}"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=300)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=2000, help="ids each call generates (prompts grow turn by turn)")
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             logging_level="ERROR", runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    from ray.data import DataContext
    DataContext.get_current().enable_progress_bars = False
    with tempfile.TemporaryDirectory() as work:
        directory = os.path.join(work, "captures")
        make_token_dir(directory, args.rollouts, args.calls, args.tokens)
        size = sum(size for _, size in capture_files(directory))
        on_ray(directory)  # Warm-up: Ray's workers start once.
        context = DataContext.get_current()
        ray_best = min(on_ray(directory) for _ in range(3))
        # Ray Data reserves part of a cluster's CPUs for each operator's downstream; on one 2-CPU
        # node that leaves a lone read one task at a time. Measured both ways.
        context.op_resource_reservation_enabled = False
        unreserved_best = min(on_ray(directory) for _ in range(3))
        context.op_resource_reservation_enabled = True
        local_best = min(in_one_process(directory) for _ in range(3))
        tasks_here = min(read_tasks_in_one_process(directory) for _ in range(3))
        assert ray_best[1] == unreserved_best[1] == local_best[1], (ray_best, local_best)
        rows, values = local_best[1], local_best[2]
        local_rate = rows / local_best[0]
        memory = []
        for times in (1, 10):
            if times > 1:
                grow(directory, times)
            paths, group_bytes = largest_group(directory, args.cpus)
            total = sum(size for _, size in capture_files(directory))
            rss, group_rows = ray.get(peak_rss_of_a_read_task.remote(paths))
            memory.append((times, total, len(paths), group_bytes, group_rows, rss))
    lines = [
        f"# records.ray_dataset vs read_token_records: {args.rollouts} rollouts x {args.calls} calls, "
        f"{args.tokens:,} generated ids a call ({size / 1e6:.0f} MB, {rows:,} token rows, {values / 1e6:.1f} M ids and logprobs)",
        "",
        "| reader | seconds (best of 3) | token rows/s | M ids+logprobs/s | ratio |",
        "|---|---:|---:|---:|---:|",
        f"| read_token_records, one process | {local_best[0]:.2f} | {local_rate:,.0f} | {values / local_best[0] / 1e6:.2f} | 1.00x |",
        f"| the dataset's read tasks run one after another in one process (Arrow blocks) | {tasks_here[0]:.2f} | "
        f"{rows / tasks_here[0]:,.0f} | {values / tasks_here[0] / 1e6:.2f} | {rows / tasks_here[0] / local_rate:.2f}x |",
        *(f"| ray_dataset(kind=\"tokens\"), {args.cpus} Ray CPUs{label} | {best[0]:.2f} | {rows / best[0]:,.0f} | "
          f"{values / best[0] / 1e6:.2f} | **{rows / best[0] / local_rate:.2f}x** |"
          for label, best in (("", ray_best), (", op_resource_reservation_enabled=False", unreserved_best))),
        "",
        "Peak RSS of one read task (a fresh Ray worker reading the largest group of files the dataset gives a task):",
        "",
        "| directory | size (MB) | files in the task | task's bytes (MB) | rows | peak RSS (MB) |",
        "|---|---:|---:|---:|---:|---:|",
        *(f"| {times}x | {total / 1e6:,.0f} | {files} | {group / 1e6:.0f} | {group_rows:,} | {rss / 1e6:.0f} |"
          for times, total, files, group, group_rows, rss in memory),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(HERE, "results", "ray.md"), "w", encoding="utf-8") as handle:
        handle.write(text)
    ray.shutdown()


if __name__ == "__main__":
    main()
