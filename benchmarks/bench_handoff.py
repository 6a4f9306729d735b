"""The live hand-off (issue 62): what a consumer costs, how soon an end is takeable, in each layout.

    python benchmarks/bench_handoff.py [--rollouts 300] [--rounds 3] [--layouts directory,segments,s3]

In each layout -- a capture directory, a capture store on a path (``segments://``), and one on a
real S3 server on loopback (moto's, as the tests use) -- RL-shaped rollouts (a 1,500-word task, then 4
chat turns) are made
through a real sidecar in the token capture mode (its stand-in model), then:

1. ``POST /-/rollouts/<id>/end`` for each: the time to a durable answer (p50, p99).
2. Interleaved rounds: the same rollouts read with `records.trajectories` one by one, against
   taken and acknowledged by a `records.Consumer` (a fresh name each round: take a training step's batch of 64, ack) --
   rollouts/s of each and the ratio (the hand-off's own cost; a FinishedRollout also carries its
   calls and weight versions).
3. End to takeable: a consumer process waits in ``take(64, wait=...)`` while the main process ends
   100 further rollouts one every ``--end-every`` seconds (0.1: ten a second, more than a run of
   512-sample steps a few minutes apart ends); the time from each end's answer to its take (p50,
   p99). A consumer that cannot keep up with the ends measures its own backlog, not the latency.

Prints markdown tables and writes them to benchmarks/results/handoff.md. Nothing is asserted;
moto answers each request in milliseconds of Python, so the S3 figures bound a real store's from
neither side: they show what the requests cost, not S3's latency.
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
    for item in consumer.take(64, wait=10.0):
        print(item.rollout_id, time.time(), flush=True)
        seen += item.rollout_id.startswith("late")  # The earlier ends are not this figure's.
        consumer.ack([item])
'''


#: The runner's admin token, given to the sidecar in its environment (ends over HTTP need it).
ADMIN_TOKEN = "bench-admin-token"


def post(url: str, body: bytes = b"") -> bytes:
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return reply.read()


#: An RL rollout's shape: a task statement of this many words, then this many turns (each reply
#: sent back, then a follow-up). The hand-off's cost is per rollout; reading grows with its tokens.
TASK_WORDS, TURNS = 1500, 4
#: What a trainer takes at once: a training step's batch (GRPO's 64 prompts x 8 samples is 512).
BATCH = 64


def converse(base: str, rollout_id: str, turns: int = TURNS, task_words: int = TASK_WORDS) -> None:
    task = " ".join(f"word{n % 97}" for n in range(task_words))
    messages = [{"role": "user", "content": f"{task} (rollout {rollout_id})"}]
    for turn in range(turns):
        reply = orjson.loads(post(f"{base}/ng-rollout/{rollout_id}/v1/chat/completions",
                                  orjson.dumps({"model": "m", "messages": messages})))
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
        messages.append({"role": "user", "content": f"go on ({turn})"})


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def s3_server(work: str, bucket: str = "handoff") -> tuple[str, subprocess.Popen]:
    """moto's S3 server in a process of its own on loopback (working in ``work``, where its recorder
    keeps ``moto_recording``), ``bucket`` made; its endpoint."""
    port = bench.free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=work)
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1", MCC_STORE_CACHE=os.path.join(work, "cache"))
    import boto3

    deadline = time.monotonic() + 30
    while True:
        try:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
            return endpoint, server
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def measure(layout: str, args: argparse.Namespace, work: str) -> dict[str, list[float]]:
    """The three figures in one layout."""
    server = None
    if layout == "s3":
        _, server = s3_server(work)
        captures = "s3://handoff/run"
    elif layout == "segments":
        os.environ["MCC_STORE_CACHE"] = os.path.join(work, "cache")
        captures = f"segments://{work}/store"
    else:
        captures = os.path.join(work, "captures")
    where = (["--capture-dir", captures] if layout == "directory"
             else ["--capture-dir", os.path.join(work, "spool"), "--capture-store", captures])
    port = bench.free_port()
    sidecar = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--stand-in", "--port", str(port), *where,
                                "--capture-tokens", "--log-level", "error"], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                               env={**os.environ, "MCC_ADMIN_TOKEN": ADMIN_TOKEN})
    figures: dict[str, list[float]] = {"end": [], "read": [], "read_held": [], "take": [], "latency": []}
    try:
        assert sidecar.stdout.readline().startswith("listening on")  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}"
        ids = [f"h{n:05d}" for n in range(args.rollouts)]
        later = [f"late{n:04d}" for n in range(100)]
        for rollout_id in ids + later:
            converse(base, rollout_id, args.turns, args.task_words)
        for rollout_id in ids:
            started = time.perf_counter()
            post(f"{base}/-/rollouts/{rollout_id}/end", orjson.dumps({"outcome": {"reward": 1.0}}))
            figures["end"].append(time.perf_counter() - started)
        if layout != "directory":  # Every end takeable (the writer's watermark past them) before the rounds.
            waiting = Consumer(captures, "warm")
            while len(waiting.take(len(ids), wait=5.0)) == 0:
                pass
        for round_number in range(args.rounds):
            started = time.perf_counter()
            for rollout_id in ids:
                trajectories(captures, rollout_id)
            figures["read"].append(len(ids) / (time.perf_counter() - started))
            started = time.perf_counter()
            for first in range(0, len(ids), BATCH):  # As a trainer without a consumer: a step's batch held.
                batch_read = [trajectories(captures, rollout_id) for rollout_id in ids[first:first + BATCH]]
            del batch_read
            figures["read_held"].append(len(ids) / (time.perf_counter() - started))
            consumer = Consumer(captures, f"bench-{round_number}")
            started, taken = time.perf_counter(), 0
            while batch := consumer.take(BATCH):
                assert all(item.trajectories.chains for item in batch)  # What a trainer reads.
                consumer.ack(batch)
                taken += len(batch)
            figures["take"].append(taken / (time.perf_counter() - started))
        taker = subprocess.Popen([sys.executable, "-c", _TAKER, ROOT, captures, str(len(later))], stdout=subprocess.PIPE,
                                 text=True)
        assert taker.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
        consumer_for_old = Consumer(captures, "latency")
        while batch := consumer_for_old.take(64):  # The first names' rollouts are not this figure's.
            consumer_for_old.ack(batch)
        answered = {}
        for rollout_id in later:
            post(f"{base}/-/rollouts/{rollout_id}/end")
            answered[rollout_id] = time.time()
            time.sleep(args.end_every)
        for line in taker.communicate(timeout=300)[0].splitlines():
            rollout_id, at = line.split()
            if rollout_id in answered:
                figures["latency"].append(float(at) - answered[rollout_id])
    finally:
        sidecar.terminate()
        sidecar.wait(timeout=30)
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layouts", default="directory,segments,s3")
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--task-words", type=int, default=TASK_WORDS)
    parser.add_argument("--end-every", type=float, default=0.1, help="seconds between the latency figure's ends")
    args = parser.parse_args()
    results = {}
    for layout in args.layouts.split(","):
        work = tempfile.mkdtemp(prefix=f"mcc-handoff-{layout}-")
        try:
            results[layout] = measure(layout, args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    ms = lambda seconds: f"{seconds * 1000:.1f}"  # noqa: E731
    lines = [f"# The live hand-off ({args.rollouts} rollouts of {args.turns} chat turns after a "
             f"{args.task_words}-word task, token mode; {args.rounds} interleaved rounds; S3: moto on loopback)", "",
             "| layout | end's durable answer p50 / p99 (ms) | end to take by a waiting consumer p50 / p99 (ms) | "
             "records.trajectories one by one, each dropped (rollouts/s) | the same, a batch of {BATCH} held "
             "(rollouts/s) | Consumer take {BATCH} + ack (rollouts/s) | cost vs dropped | cost vs held |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines[2] = lines[2].format(BATCH=BATCH)
    spread = lambda values: f"{statistics.median(values):,.0f} ({min(values):,.0f} - {max(values):,.0f})"  # noqa: E731
    for layout, figures in results.items():
        read, held = statistics.median(figures["read"]), statistics.median(figures["read_held"])
        take = statistics.median(figures["take"])
        lines.append(f"| {layout} | {ms(pct(figures['end'], 50))} / {ms(pct(figures['end'], 99))} "
                     f"| {ms(pct(figures['latency'], 50))} / {ms(pct(figures['latency'], 99))} "
                     f"| {spread(figures['read'])} | {spread(figures['read_held'])} | {spread(figures['take'])} "
                     f"| {read / take:.2f}x | {held / take:.2f}x |")
    lines += ["", "The hand-off's own cost: the time to take and acknowledge a rollout over the time to read its "
              "trajectories with `records.trajectories` (the target: at most 1.25x; a FinishedRollout also carries "
              "its calls and weight versions, read when asked). A trainer holds a step's batch while it trains; "
              "the collector's passes over a held batch cost the same whoever read it, so 'cost vs held' is "
              "the hand-off's own (claims, acks, their barriers, the ends read), 'cost vs dropped' adds the "
              "held batch's."]
    table = "\n".join(lines) + "\n"
    print(table)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "handoff.md"), "w", encoding="utf-8") as handle:
        handle.write(table)


if __name__ == "__main__":
    main()
