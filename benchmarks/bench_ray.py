"""`records.ray_dataset` against `records.read_token_records` on the same files (issue 24).

    python benchmarks/bench_ray.py [--cpus 2] [--rounds 3] [--runs reasoning-0.6GB,reasoning,agentic]

1. Token rows/s, for two shapes of run (`RUNS`: reasoning, few long generations; agentic,
   many turns whose prompts re-send the conversation): the whole directory read as
   ``kind="tokens"`` on a local Ray with ``--cpus`` CPUs (rows handed to the driver as Arrow
   batches), beside `read_token_records` over every rollout in this one process, and beside the
   dataset's own read tasks run one after another here. The readers take turns, round after
   round (this machine's speed drifts by a third over minutes; turns put every reader in every
   phase of it), after one warm-up read (Ray's workers started): the best round of each, and
   the median over rounds of each round's own ratio. Ray Data's default context, and with its
   per-operator resource reservation off.
2. Peak RSS of a read task (a fresh process doing a read task's work over the largest group of
   files the dataset would give one task), with a directory at 1x and at 10x its size.

How big a directory: Ray Data starts every execution with a fixed cost. Its cluster autoscaler
has no resources to report until its coordinator first answers, and its resource manager reads
them once a second, so over the first second one task runs (Ray 2.60 with the default reservation;
`ray.timeline()` shows the second task starting at 1.0-1.1 s). A run's throughput is therefore
measured on runs of 16,000 or more calls (2.4 GB, ~25-50 s in one process), where that second is
a few percent, as it is in a real run of hours; the reasoning shape is also measured at 0.6 GB
(a few seconds on Ray), where the second shows.

Prints a markdown table and writes it to results/ray.md. The ratio, not the absolute rate, is
the figure: both sides run in the same run on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import ray  # noqa: E402

from records import CaptureStore, ray_dataset, read_token_records  # noqa: E402
from records.training import capture_files  # noqa: E402
from records.training._datasets import group_files, read_group  # noqa: E402
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


#: A read task's work in a process of its own: what it holds after its imports, and its peak.
_READ_TASK = """
import json, sys
from records.training._datasets import read_group
import numpy, pyarrow

def status(field):  # VmHWM, not ru_maxrss: ru_maxrss survives exec, so it starts at the parent's.
    with open("/proc/self/status") as lines:
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":"))

paths = json.load(sys.stdin)
before = status("VmRSS")
rows = sum(table.num_rows for table in read_group(paths, "tokens"))
print(json.dumps([rows, before, status("VmHWM")]))
"""


def peak_rss_of_a_read_task(paths: list[str]) -> tuple[int, int, int]:
    """(rows, RSS after the imports, peak RSS) of a fresh process doing exactly what a read task
    does (`read_group`): a Ray worker that ran other tasks keeps their memory, so its own peak
    would not be this task's."""
    done = subprocess.run([sys.executable, "-c", _READ_TASK], input=json.dumps(paths), capture_output=True,
                          text=True, check=True, env={**os.environ, "PYTHONPATH": ROOT})
    rows, before, peak = json.loads(done.stdout)
    return rows, before, peak


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


#: The runs read: (name, rollouts, calls, generated ids a call, tool-result ids a turn).
#: Reasoning: few long generations. Agentic: many turns, each prompt adding the turn's generation
#: and a tool's result (the prompts, re-sent every turn, are most of the ids). Both whole runs are
#: about 2.4 GB; the small reasoning run (0.6 GB) shows Ray Data's fixed start (module docstring).
RUNS = (("reasoning-0.6GB", 1000, 4, 2000, 1), ("reasoning", 4000, 4, 2000, 1), ("agentic", 3400, 12, 400, 600))


def measure_run(work: str, run: tuple, rounds: int) -> list[str]:
    """The throughput table of one run."""
    from ray.data import DataContext

    name, rollouts, calls, tokens, tool = run
    directory = os.path.join(work, name)
    make_token_dir(directory, rollouts, calls, tokens, tool_tokens=tool)
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
    times: dict[str, list[tuple]] = {reader: [] for reader in readers}
    for _ in range(rounds):
        for reader, read in readers.items():
            times[reader].append(read(directory))
    local_best, ray_best, unreserved_best, tasks_here = (min(times[reader]) for reader in readers)

    def median_ratio(reader: str) -> float:
        """The median over rounds of (reader's rows/s) / (read_token_records' rows/s in that round):
        each round's readers ran within a minute of each other, so drift cancels."""
        return statistics.median(local[0] / other[0] for local, other in zip(times["local"], times[reader]))

    assert ray_best[1] == unreserved_best[1] == local_best[1] == tasks_here[1], (ray_best, local_best)
    shutil.rmtree(directory)
    rows, values = local_best[1], local_best[2]
    local_rate = rows / local_best[0]
    return [
        f"## {name}: {rollouts:,} rollouts x {calls} calls, {tokens:,} generated ids a call, {tool:,} tool-result ids "
        f"a turn ({size / 1e6:.0f} MB, {rows:,} token rows, {values / 1e6:.1f} M ids and logprobs)",
        "",
        f"| reader | seconds (best of {rounds} rounds) | token rows/s | M ids+logprobs/s | ratio of bests | "
        "ratio, median of rounds |",
        "|---|---:|---:|---:|---:|---:|",
        f"| read_token_records, one process | {local_best[0]:.2f} | {local_rate:,.0f} | {values / local_best[0] / 1e6:.2f} "
        "| 1.00x | 1.00x |",
        f"| the dataset's read tasks run one after another in one process (Arrow blocks) | {tasks_here[0]:.2f} | "
        f"{rows / tasks_here[0]:,.0f} | {values / tasks_here[0] / 1e6:.2f} | {rows / tasks_here[0] / local_rate:.2f}x | "
        f"{median_ratio('tasks'):.2f}x |",
        *(f"| ray_dataset(kind=\"tokens\"), 2 Ray CPUs{label} | {best[0]:.2f} | {rows / best[0]:,.0f} | "
          f"{values / best[0] / 1e6:.2f} | **{rows / best[0] / local_rate:.2f}x** | **{median_ratio(reader):.2f}x** |"
          for label, best, reader in (("", ray_best, "ray"),
                                      (", op_resource_reservation_enabled=False", unreserved_best, "unreserved"))),
        "",
    ]


def measure_memory(work: str, rollouts: int, cpus: int) -> list[str]:
    """The peak RSS of a read task with the directory at 1x and 10x (the reasoning shape)."""
    _, _, calls, tokens, tool = RUNS[0]
    directory = os.path.join(work, "memory")
    make_token_dir(directory, rollouts, calls, tokens, tool_tokens=tool)
    memory = []
    for times_bigger in (1, 10):
        if times_bigger > 1:
            grow(directory, times_bigger)
        paths, group_bytes = largest_group(directory, cpus)
        total = sum(size for _, size in capture_files(directory))
        group_rows, before, rss = peak_rss_of_a_read_task(paths)
        memory.append((times_bigger, total, len(paths), group_bytes, group_rows, before, rss))
    return [
        f"## Peak RSS of one read task (a fresh process doing a read task's work over the largest group of files the "
        f"dataset gives a task; the 1x directory is {rollouts} rollouts of the reasoning shape)",
        "",
        "| directory | size (MB) | files in the task | task's bytes (MB) | rows | RSS after imports (MB) | peak RSS (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(f"| {times_bigger}x | {total / 1e6:,.0f} | {files} | {group / 1e6:.0f} | {group_rows:,} | {before / 1e6:.0f} | "
          f"{rss / 1e6:.0f} |" for times_bigger, total, files, group, group_rows, before, rss in memory),
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", default=",".join(run[0] for run in RUNS))
    parser.add_argument("--memory-rollouts", type=int, default=300, help="the 1x directory of the memory table")
    args = parser.parse_args()
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             logging_level="ERROR", runtime_env={"env_vars": {"PYTHONPATH": ROOT}})
    from ray.data import DataContext
    DataContext.get_current().enable_progress_bars = False
    lines = [f"# records.ray_dataset ({args.cpus} Ray CPUs) vs read_token_records (one process), the same files", ""]
    with tempfile.TemporaryDirectory() as work:
        for run in RUNS:
            if run[0] in args.runs.split(","):
                lines += measure_run(work, run, args.rounds)
        lines += measure_memory(work, args.memory_rollouts, args.cpus)
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(HERE, "results", "ray.md"), "w", encoding="utf-8") as handle:
        handle.write(text)
    ray.shutdown()


if __name__ == "__main__":
    main()
