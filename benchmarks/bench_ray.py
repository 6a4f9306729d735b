"""`records.ray_dataset` against `records.read_token_records` on the same files (issue 24).

    python benchmarks/bench_ray.py [--rollouts N] [--calls C] [--tokens T] [--cpus 2] [--rounds 5]

1. Token rows/s: the whole directory read as ``kind="tokens"`` on a local Ray with ``--cpus``
   CPUs (rows handed to the driver as Arrow batches), beside `read_token_records` over every
   rollout in this one process, and beside the dataset's own read tasks run one after another
   here. The readers take turns, round after round (this machine's speed drifts by a third
   over minutes; turns put every reader in every phase of it), after one warm-up read (Ray's
   workers started). Best round of each; Ray Data's default context, and with its per-operator
   resource reservation off.
2. Peak RSS of a read task (a Ray worker's peak, reset before it reads the largest group of
   files the dataset would give one task), with a directory at 1x and at 10x its size.

The directory is a whole run's worth of reading (1,000 rollouts, ~600 MB, ~10 s in one
process): Ray Data ramps up over its first second (it learns the cluster's resources), a fixed
cost a run of a few seconds would show and a real run does not.

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


@ray.remote(max_calls=1)
def peak_rss_of_a_read_task(paths: list[str]) -> tuple[int, int]:
    """The worker's peak RSS while it runs the read (a worker may have run other tasks before:
    its peak is reset first, through /proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # Resets VmHWM, the peak RSS, to the RSS now.
    rows = sum(table.num_rows for table in read_group(paths, "tokens"))
    with open("/proc/self/status") as status:
        peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    return peak_kb * 1024, rows


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
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=2000, help="ids each call generates (prompts grow turn by turn)")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--memory-rollouts", type=int, default=300, help="the 1x directory of the memory table")
    args = parser.parse_args()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             logging_level="ERROR", runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    from ray.data import DataContext
    DataContext.get_current().enable_progress_bars = False
    with tempfile.TemporaryDirectory() as work:
        directory = os.path.join(work, "captures")
        make_token_dir(directory, args.rollouts, args.calls, args.tokens)
        size = sum(size for _, size in capture_files(directory))
        context = DataContext.get_current()
        on_ray(directory)  # Warm-up: Ray's workers start once.

        def unreserved(path: str) -> tuple[float, int]:
            # Ray Data reserves part of a cluster's resources for each operator's downstream;
            # measured both ways.
            context.op_resource_reservation_enabled = False
            try:
                return on_ray(path)
            finally:
                context.op_resource_reservation_enabled = True

        readers = {"local": in_one_process, "ray": on_ray, "unreserved": unreserved, "tasks": read_tasks_in_one_process}
        times: dict[str, list[tuple]] = {name: [] for name in readers}
        for _ in range(args.rounds):
            for name, reader in readers.items():
                times[name].append(reader(directory))
        local_best, ray_best, unreserved_best, tasks_here = (min(times[name]) for name in readers)
        assert ray_best[1] == unreserved_best[1] == local_best[1] == tasks_here[1], (ray_best, local_best)
        rows, values = local_best[1], local_best[2]
        local_rate = rows / local_best[0]
        shutil.rmtree(directory)
        memory = []
        directory = os.path.join(work, "memory")
        make_token_dir(directory, args.memory_rollouts, args.calls, args.tokens)
        for times_bigger in (1, 10):
            if times_bigger > 1:
                grow(directory, times_bigger)
            paths, group_bytes = largest_group(directory, args.cpus)
            total = sum(size for _, size in capture_files(directory))
            rss, group_rows = ray.get(peak_rss_of_a_read_task.remote(paths))
            memory.append((times_bigger, total, len(paths), group_bytes, group_rows, rss))
    lines = [
        f"# records.ray_dataset vs read_token_records: {args.rollouts} rollouts x {args.calls} calls, "
        f"{args.tokens:,} generated ids a call ({size / 1e6:.0f} MB, {rows:,} token rows, {values / 1e6:.1f} M ids and logprobs)",
        "",
        f"| reader | seconds (best of {args.rounds} rounds) | token rows/s | M ids+logprobs/s | ratio |",
        "|---|---:|---:|---:|---:|",
        f"| read_token_records, one process | {local_best[0]:.2f} | {local_rate:,.0f} | {values / local_best[0] / 1e6:.2f} | 1.00x |",
        f"| the dataset's read tasks run one after another in one process (Arrow blocks) | {tasks_here[0]:.2f} | "
        f"{rows / tasks_here[0]:,.0f} | {values / tasks_here[0] / 1e6:.2f} | {rows / tasks_here[0] / local_rate:.2f}x |",
        *(f"| ray_dataset(kind=\"tokens\"), {args.cpus} Ray CPUs{label} | {best[0]:.2f} | {rows / best[0]:,.0f} | "
          f"{values / best[0] / 1e6:.2f} | **{rows / best[0] / local_rate:.2f}x** |"
          for label, best in (("", ray_best), (", op_resource_reservation_enabled=False", unreserved_best))),
        "",
        f"Peak RSS of one read task (a Ray worker's peak, reset before it reads the largest group of files the dataset gives a task; "
        f"the 1x directory is {args.memory_rollouts} rollouts of the same shape):",
        "",
        "| directory | size (MB) | files in the task | task's bytes (MB) | rows | peak RSS (MB) |",
        "|---|---:|---:|---:|---:|---:|",
        *(f"| {times_bigger}x | {total / 1e6:,.0f} | {files} | {group / 1e6:.0f} | {group_rows:,} | {rss / 1e6:.0f} |"
          for times_bigger, total, files, group, group_rows, rss in memory),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(HERE, "results", "ray.md"), "w", encoding="utf-8") as handle:
        handle.write(text)
    ray.shutdown()


if __name__ == "__main__":
    main()
