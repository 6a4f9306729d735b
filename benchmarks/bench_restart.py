"""What a trainer's restart costs (issue 71): a trainer SIGKILLed mid-step, then restarted, gets its
crashed batch back at once.

    python benchmarks/bench_restart.py [--restarts 20] [--history 2000] [--layouts directory,segments]

In each layout (a capture directory; a capture store on a path, ``segments://``), ``--history``
ended rollouts are taken and committed first (a run under way), then, ``--restarts`` times: a
trainer process starts (``Consumer`` + ``rewind``, as the README's recipe), takes a GRPO step's
batch (8 groups of 4) and is SIGKILLed before it acknowledges; a new trainer process is started at
once and its first ``take`` is timed: from the moment the killed process was reaped to the batch in
hand (process start, imports, the new incarnation, the rewind and the take), and the take alone.
Before this issue the batch came back only when its lease ran out: ``lease_seconds``, 300 s by
default. Prints a markdown table and writes it to benchmarks/results/restart.md. Nothing asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import bench_proxy as bench  # noqa: E402
from records import Consumer, end_rollout  # noqa: E402

GROUPS, GROUP_SIZE = 8, 4

_KILLED = r'''
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from records import Consumer
trainer = Consumer(sys.argv[2], "trainer")
trainer.rewind(int(sys.argv[3]))
batch = trainer.take(8, group_size=4)
print(" ".join(sorted(group.item for group in batch)), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
'''

_RESTARTED = r'''
import sys, time
began = time.time()
sys.path.insert(0, sys.argv[1])
from records import Consumer
trainer = Consumer(sys.argv[2], "trainer")
trainer.rewind(int(sys.argv[3]))
took = time.time()
batch = trainer.take(8, group_size=4)
done = time.time()
print(began, took, done, " ".join(sorted(group.item for group in batch)), flush=True)
trainer.ack(batch, step=int(sys.argv[3]) + 1)
trainer.commit(int(sys.argv[3]) + 1)
'''


def end_groups(captures: str, first: int, groups: int) -> None:
    for task in range(first, first + groups):
        for member in range(GROUP_SIZE):
            end_rollout(captures, f"task{task:06d}-{member}", outcome={"reward": member / GROUP_SIZE}, allow_empty=True)


def measure(captures: str, restarts: int, history: int) -> dict[str, list[float]]:
    end_groups(captures, 0, history // GROUP_SIZE)
    consumer, step = Consumer(captures, "trainer"), 0
    while batch := consumer.take(64, group_size=GROUP_SIZE):
        step += 1
        consumer.ack(batch, step=step)
        consumer.commit(step)
    figures: dict[str, list[float]] = {"restart": [], "take": []}
    next_task = history // GROUP_SIZE
    for _ in range(restarts):
        end_groups(captures, next_task, GROUPS)
        next_task += GROUPS
        killed = subprocess.run([sys.executable, "-c", _KILLED, ROOT, captures, str(step)], capture_output=True, text=True,
                                timeout=120)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        reaped = time.time()
        restarted = subprocess.run([sys.executable, "-c", _RESTARTED, ROOT, captures, str(step)], capture_output=True,
                                   text=True, timeout=120)
        assert restarted.returncode == 0, restarted.stderr
        began, took, done, *items = restarted.stdout.split()
        assert sorted(items) == killed.stdout.split(), "the crashed batch, in the first take"
        figures["restart"].append(float(done) - reaped)
        figures["take"].append(float(done) - float(took))
        step += 1
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--restarts", type=int, default=20)
    parser.add_argument("--history", type=int, default=2000)
    parser.add_argument("--layouts", default="directory,segments")
    args = parser.parse_args()
    lines = [f"# A trainer's restart ({args.restarts} SIGKILLs mid-step, each followed by a restart; "
             f"{args.history:,} rollouts consumed before; a step: {GROUPS} groups of {GROUP_SIZE})", "",
             "| layout | killed to its batch back in the restarted process, p50 / p99 (ms) | the first take alone, "
             "p50 / p99 (ms) | before (the lease ran out) |", "|---|---:|---:|---:|"]
    for layout in args.layouts.split(","):
        work = tempfile.mkdtemp(prefix=f"mcc-restart-{layout}-")
        try:
            if layout == "segments":
                os.environ["MCC_STORE_CACHE"] = os.path.join(work, "cache")
                captures = f"segments://{work}/store"
            else:
                captures = os.path.join(work, "captures")
                os.makedirs(captures)
            figures = measure(captures, args.restarts, args.history)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        ms = lambda values, p: f"{bench.pct(values, p) * 1000:,.0f}"  # noqa: E731
        lines.append(f"| {layout} | {ms(figures['restart'], 50)} / {ms(figures['restart'], 99)} "
                     f"| {ms(figures['take'], 50)} / {ms(figures['take'], 99)} | 300,000 (lease_seconds) |")
        print(f"{layout}: median {statistics.median(figures['restart']) * 1000:,.0f} ms", file=sys.stderr)
    lines += ["", "The restarted process's time includes starting Python and importing `records`; the lease "
              "(`lease_seconds`) still covers a holder that stalls without dying."]
    bench.publish("restart", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
