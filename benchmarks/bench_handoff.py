"""The live hand-off on a capture directory (issue 62): what a consumer costs, how soon an end is takeable.

    python benchmarks/bench_handoff.py [--rollouts 300] [--rounds 3]

Rollouts of two chat turns each are made through a real sidecar in the token capture mode (its
stand-in model), then:

1. ``POST /-/rollouts/<id>/end`` for each: the time to a durable answer (p50, p99).
2. Interleaved rounds: the same rollouts read with `records.trajectories` one by one, against
   taken and acknowledged by a `records.Consumer` (a fresh name each round: take 32, ack) --
   rollouts/s of each and the ratio (the hand-off's own cost; a FinishedRollout also carries its
   calls and weight versions).
3. End to takeable: a consumer process waits in ``take(8, wait=...)`` while the main process ends
   further rollouts one every 20 ms; the time from each end's answer to its take (p50, p99).

Prints markdown tables and writes them to benchmarks/results/handoff.md. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import orjson  # noqa: E402

import bench_proxy as bench  # noqa: E402
from records import Consumer, trajectories  # noqa: E402

_TAKER = r'''
import sys, time
sys.path.insert(0, sys.argv[1])
from records import Consumer
consumer, expected = Consumer(sys.argv[2], "latency"), int(sys.argv[3])
print("ready", flush=True)
seen = 0
while seen < expected:
    for item in consumer.take(8, wait=10.0):
        print(item.rollout_id, time.time(), flush=True)
        seen += 1
        consumer.ack([item])
'''


def post(url: str, body: bytes = b"") -> bytes:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return reply.read()


def converse(base: str, rollout_id: str) -> None:
    messages = [{"role": "user", "content": "hi"}]
    for follow_up in ("more", None):
        reply = orjson.loads(post(f"{base}/ng-rollout/{rollout_id}/v1/chat/completions",
                                  orjson.dumps({"model": "m", "messages": messages})))
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="mcc-handoff-")
    directory = os.path.join(work, "captures")
    port = bench.free_port()
    sidecar = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--stand-in", "--port", str(port), "--capture-dir",
                                directory, "--capture-tokens", "--log-level", "error"], stdout=subprocess.PIPE, text=True,
                               cwd=ROOT)
    try:
        assert sidecar.stdout.readline().startswith("listening on")  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}"
        ids = [f"h{n:05d}" for n in range(args.rollouts)]
        later = [f"late{n:04d}" for n in range(100)]
        for rollout_id in ids + later:
            converse(base, rollout_id)
        end_times = []
        for rollout_id in ids:
            started = time.perf_counter()
            post(f"{base}/-/rollouts/{rollout_id}/end", orjson.dumps({"outcome": {"reward": 1.0}}))
            end_times.append(time.perf_counter() - started)
        read_rates, take_rates = [], []
        for round_number in range(args.rounds):
            started = time.perf_counter()
            for rollout_id in ids:
                trajectories(directory, rollout_id)
            read_rates.append(len(ids) / (time.perf_counter() - started))
            consumer = Consumer(directory, f"bench-{round_number}")
            started, taken = time.perf_counter(), 0
            while batch := consumer.take(32):
                consumer.ack(batch)
                taken += len(batch)
            take_rates.append(taken / (time.perf_counter() - started))
        taker = subprocess.Popen([sys.executable, "-c", _TAKER, ROOT, directory, str(len(later))], stdout=subprocess.PIPE,
                                 text=True)
        assert taker.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        consumer_for_old = Consumer(directory, "latency")
        while batch := consumer_for_old.take(64):  # The first names' rollouts are not this figure's.
            consumer_for_old.ack(batch)
        answered = {}
        for rollout_id in later:
            post(f"{base}/-/rollouts/{rollout_id}/end")
            answered[rollout_id] = time.time()
            time.sleep(0.02)
        latencies = []
        for line in taker.communicate(timeout=120)[0].splitlines():
            rollout_id, at = line.split()
            if rollout_id in answered:
                latencies.append(float(at) - answered[rollout_id])
    finally:
        sidecar.terminate()
        sidecar.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    ms = lambda seconds: f"{seconds * 1000:.1f}"  # noqa: E731
    lines = [f"# The live hand-off on a capture directory ({args.rollouts} rollouts of 2 chat turns, token mode; "
             f"{args.rounds} interleaved rounds)", "",
             "| measure | p50 | p99 |", "|---|---:|---:|",
             f"| POST /-/rollouts/<id>/end, to its durable answer (ms) | {ms(pct(end_times, 50))} | {ms(pct(end_times, 99))} |",
             f"| an end's answer to its take by a waiting consumer process (ms) | {ms(pct(latencies, 50))} | "
             f"{ms(pct(latencies, 99))} |", "",
             "| reader | rollouts/s (median) | min - max |", "|---|---:|---:|",
             f"| records.trajectories, one by one | {statistics.median(read_rates):,.0f} | "
             f"{min(read_rates):,.0f} - {max(read_rates):,.0f} |",
             f"| Consumer: take 32 + ack (calls, trajectories, weight versions) | {statistics.median(take_rates):,.0f} | "
             f"{min(take_rates):,.0f} - {max(take_rates):,.0f} |", "",
             f"The hand-off's own cost: {statistics.median(read_rates) / statistics.median(take_rates):.2f}x the time of "
             f"reading the same rollouts' trajectories (the target: at most 1.25x)."]
    table = "\n".join(lines) + "\n"
    print(table)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "handoff.md"), "w", encoding="utf-8") as handle:
        handle.write(table)


if __name__ == "__main__":
    main()
