"""The hand-off at a long run's scale (issue 74): what a take, an ack, a commit, a restart's first
take and ``counts()`` cost after 1,000 to 1,000,000 consumed rollouts, this code beside an earlier one.

    python benchmarks/bench_scale.py [--sizes 1000,10000,100000,1000000] [--before <checkout>]
                                     [--layouts directory,segments,s3] [--s3-sizes 1000,10000]

**The run's history, made fast.** Consuming a million rollouts through the API takes hours (a
durable end each, then takes, acks and commits), so each size's history is written as the code
leaves it, straight to files (objects on S3), and only the measured operations go through
`records`: rollouts ``s0000000`` ... ended 100 a second up to ten minutes ago (one end file each,
with its entries in the time indexes where the code has them), a capture file each (hard links to
one line: never read), and the consumer name ``trainer`` that took them in steps of 512: each
rollout's claim and ack (hard links: never read by either code, present as a run leaves them), a
commit per step, and what the code summarises them into (the newest summary of every final item
before; a checkpoint after). On S3 (moto on loopback) each object is a PUT, so it goes as far as
moto allows in the time (``--s3-sizes``).

**Measured, as the issue's walk did it:** a new `Consumer` (a restart: ``rewind`` to the last
step); then three rounds of 64 new rollouts, each captured (`CaptureStore.record`) and ended
(`records.end_rollout`, durable), taken (``take(64)``), acknowledged at the next step and
committed, and ``counts()``; then 64 more ended and a restart's first take (a new `Consumer`,
``rewind``, ``take(64)``). On S3 the requests each operation makes are counted at the server
(moto's recorder): LIST, GET (HEAD counted with it), PUT; and an idle uploader's round (its
watermark's listing of the ends and its put).

Prints markdown tables and writes them to benchmarks/results/scale.md. Nothing is asserted.
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
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: Rollouts end this many a second in the made history (an async RL run of 512-rollout steps every few seconds).
RATE = 100.0
STEP = 512
BATCH = 64
ROUNDS = 3
#: S3 prices per 1,000 requests (AWS S3 Standard, us-east-1, https://aws.amazon.com/s3/pricing/, as of 2026-12):
#: PUT, COPY, POST, LIST $0.005; GET and all other requests $0.0004.
PRICE_PER_1000 = {"LIST": 0.005, "PUT": 0.005, "GET": 0.0004}


# -- the worker: one size, one layout, one checkout -------------------------------------------------

class _Linker:
    """Hard links to one file, a new one every 60,000 (ext4 allows 65,000 links to an inode)."""

    def __init__(self, directory: str, name: str, data: bytes) -> None:
        self.directory, self.name, self.data, self.count, self.path = directory, name, data, 0, ""

    def link(self, path: str) -> None:
        if self.count % 60000 == 0:
            self.path = os.path.join(self.directory, f".template.{self.name}.{self.count}")
            with open(self.path, "wb") as handle:
                handle.write(self.data)
        self.count += 1
        os.link(self.path, path)


def _make_history(records_mod, where: str, layout: str, size: int) -> dict:
    """Write the run's history as the checkout's code leaves it (see the module's docstring)."""
    contract = records_mod.contract
    new = hasattr(contract, "END_INDEX")
    now = time.time()
    first = now - size / RATE - 600.0
    stamps = [first + n / RATE for n in range(size)]
    ids = [f"s{n:07d}" for n in range(size)]
    steps = (size + STEP - 1) // STEP
    objects: dict[str, bytes] = {}  # A store's objects (name -> bytes); a directory's are files.

    if layout == "directory":
        os.makedirs(where, exist_ok=True)
        template = _Linker(where, "capture", contract.encode_capture_line(
            {"model_call_id": "0" * 32, "dialect": "chat", "status_code": 200}))
        empty = _Linker(where, "empty", b"")
        buckets: set[str] = set()
        for rollout_id, stamp in zip(ids, stamps):
            template.link(os.path.join(where, rollout_id + contract.CAPTURE_SUFFIX))
            fd = os.open(os.path.join(where, rollout_id + contract.END_SUFFIX), os.O_WRONLY | os.O_CREAT, 0o644)
            os.write(fd, json.dumps({"rollout_id": rollout_id, "ended_at": stamp, "outcome": {"reward": 1.0},
                                     "group": None, "group_size": None, "calls": 1}).encode() + b"\n")
            os.close(fd)
            if new:
                for kind, at in ((contract.END_INDEX, stamp), (contract.START_INDEX, stamp - 30.0)):
                    path = os.path.join(where, *contract.index_name(kind, at, rollout_id).split("/"))
                    bucket = os.path.dirname(path)
                    if bucket not in buckets:
                        os.makedirs(bucket, exist_ok=True)
                        buckets.add(bucket)
                    empty.link(path)
    else:
        template_line = b"s\t" + b'{"model_call_id":"00","dialect":"chat","status_code":200}\n'
        for rollout_id, stamp in zip(ids, stamps):
            objects[f"ends/{rollout_id}.json"] = json.dumps(
                {"rollout_id": rollout_id, "ended_at": stamp, "outcome": {"reward": 1.0}, "group": None,
                 "group_size": None, "calls": None}).encode() + b"\n"
            if new:
                objects[contract.index_name(contract.END_INDEX, stamp, rollout_id)] = b""
                objects[contract.index_name(contract.START_INDEX, stamp - 30.0, rollout_id)] = b""
        objects["writers/synthetic.json"] = json.dumps(
            {"spool": "synthetic", "watermark": now, "holding": [], "seen": [], "pending": [], "stopped": True,
             "at": now}).encode()
        del template_line

    # The consumer name's state: a claim and an ack per rollout, a commit per step.
    root = "consumers/trainer"
    claim = json.dumps({"kind": "claim", "holder": "h", "expires_at": now, "incarnation": 1, "epoch": None}).encode()
    state: dict[str, bytes] = {f"{root}/incarnations/{1:010d}.json": json.dumps({"holder": "h", "at": first}).encode()}
    for step in range(1, steps + 1):
        state[f"{root}/log/{step:010d}.json"] = json.dumps(
            {"kind": "commit", "step": step, "at": stamps[min(size - 1, step * STEP - 1)] + 1.0, "holder": "h"}).encode()
    if new:
        state[f"{root}/checkpoints/{1:010d}.json"] = json.dumps(
            {"cursor": stamps[-1] + 0.5, "counts": {"final": size, "dropped": 0, "stale": 0, "partial": 0}, "open": [],
             "unended": {}, "log_from": steps, "at": now, "holder": "h"}).encode()
        state[f"{root}/checkpoints/newest"] = b"1"
    else:
        state[f"{root}/final/{1:010d}.json"] = json.dumps({"final": {rollout_id: 0 for rollout_id in ids}}).encode()

    if layout == "directory":
        for name, data in state.items():
            path = os.path.join(where, *name.split("/"))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(data)
        items = os.path.join(where, root, "items")
        os.makedirs(items, exist_ok=True)
        claim_file = _Linker(where, "claim", claim)
        ack_file = _Linker(where, "ack", b'{"kind":"ack","step":1,"epoch":1,"after_log":0}')
        for rollout_id in ids:
            claim_file.link(os.path.join(items, f"{rollout_id}.{1:010d}.json"))
            ack_file.link(os.path.join(items, f"{rollout_id}.{2:010d}.json"))
    else:
        objects.update(state)
        for rollout_id in ids:
            objects[f"{root}/items/{rollout_id}.{1:010d}.json"] = claim
            objects[f"{root}/items/{rollout_id}.{2:010d}.json"] = b'{"kind":"ack","step":1,"epoch":1,"after_log":0}'
        _put_all(where, objects)
    return {"steps": steps, "new": new}


def _put_all(url: str, objects: dict[str, bytes]) -> None:
    if url.startswith("segments://"):
        root = url[len("segments://"):]
        made: set[str] = set()
        for name, data in objects.items():
            path = os.path.join(root, *name.split("/"))
            directory = os.path.dirname(path)
            if directory not in made:
                os.makedirs(directory, exist_ok=True)
                made.add(directory)
            with open(path, "wb") as handle:
                handle.write(data)
        return
    import boto3
    from concurrent.futures import ThreadPoolExecutor

    bucket, _, prefix = url[len("s3://"):].partition("/")
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda item: client.put_object(Bucket=bucket, Key=f"{prefix}/{item[0]}", Body=item[1]),
                      objects.items()))


class _Requests:
    """Requests counted at moto's server (its recorder), by kind."""

    def __init__(self, endpoint: str | None) -> None:
        self.endpoint = endpoint

    def _post(self, what: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/recorder/{what}", method="POST"))

    def start(self) -> None:
        if self.endpoint:
            self._post("reset-recording")
            self._post("start-recording")

    def stop(self) -> dict[str, int]:
        if not self.endpoint:
            return {}
        self._post("stop-recording")
        counts = {"LIST": 0, "GET": 0, "PUT": 0}
        for line in urllib.request.urlopen(f"{self.endpoint}/moto-api/recorder/download-recording").read().splitlines():
            request = json.loads(line)
            method, url = request["method"], request["url"]
            if "moto-api" in url:
                continue
            kind = "LIST" if method == "GET" and "list-type=" in url else "GET" if method in ("GET", "HEAD") else "PUT"
            counts[kind] += 1
        return counts


def worker(args: argparse.Namespace) -> None:
    sys.path.insert(0, args.tree)
    import records

    layout, size = args.layout, args.size
    where = (os.path.join(args.work, "captures") if layout == "directory"
             else f"segments://{args.work}/store" if layout == "segments" else f"s3://scale/run-{size}")
    made_started = time.perf_counter()
    history = _make_history(records, where, layout, size)
    made = time.perf_counter() - made_started
    requests = _Requests(os.environ.get("AWS_ENDPOINT_URL") if layout == "s3" else None)
    figures: dict[str, list] = {key: [] for key in ("end", "take", "ack", "commit", "counts", "restart", "cycle")}
    counted: dict[str, dict[str, int]] = {}
    step = history["steps"]
    serial = 0

    def end_new(count: int) -> None:
        nonlocal serial
        for _ in range(count):
            rollout_id = f"n{serial:07d}"
            serial += 1
            if layout == "directory":
                records.CaptureStore(where).record(rollout_id, {"model_call_id": "1" * 32, "dialect": "chat",
                                                                "status_code": 200})
                records.end_rollout(where, rollout_id, {"reward": 1.0})
            else:
                records.end_rollout(where, rollout_id, {"reward": 1.0}, allow_empty=True)

    def timed(key: str, action):
        requests.start()
        started = time.perf_counter()
        result = action()
        figures[key].append(time.perf_counter() - started)
        found = requests.stop()
        if found:
            counted.setdefault(key, found)
        return result

    consumer = records.Consumer(where, "trainer")
    consumer.rewind(step)
    for _ in range(ROUNDS):
        timed("end", lambda: end_new(BATCH))
        step += 1
        started = time.perf_counter()
        batch = timed("take", lambda: consumer.take(BATCH, wait=30.0))
        while len(batch) < BATCH:  # (From a store: an end is takeable once the writer's watermark passes it.)
            batch += consumer.take(BATCH - len(batch), wait=30.0)
        timed("ack", lambda batch=batch, step=step: consumer.ack(batch, step=step))
        timed("commit", lambda step=step: consumer.commit(step))
        figures["cycle"].append(time.perf_counter() - started)
        timed("counts", consumer.counts)
    end_new(BATCH)

    def restart():
        again = records.Consumer(where, "trainer")
        again.rewind(step)
        return again.take(BATCH, wait=30.0)

    timed("restart", restart)
    if layout == "s3":  # An idle sidecar's uploader: one round of the live hand-off (nothing to ship).
        from capture.journal import Uploader

        spool = os.path.join(args.work, "spool")
        os.makedirs(spool, exist_ok=True)
        uploader = Uploader(spool, where)
        uploader.hand_off_round()  # A spool's first round lists the index whole once (old ends to refuse).
        requests.start()
        uploader.hand_off_round()
        counted["idle uploader round"] = requests.stop()
    print(json.dumps({"made": made, "figures": figures, "requests": counted}))


# -- the driver ------------------------------------------------------------------------------------

def run(tree: str, layout: str, size: int, env: dict) -> dict:
    work = tempfile.mkdtemp(prefix=f"mcc-scale-{layout}-{size}-")
    try:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--tree", tree, "--layout", layout,
                               "--size", str(size), "--work", work],
                              capture_output=True, text=True, env={**env, "MCC_STORE_CACHE": os.path.join(work, "cache")},
                              timeout=7200)
        if done.returncode != 0:
            return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def s3_endpoint() -> tuple[str, subprocess.Popen]:
    """moto's server as bench_handoff starts it (its recorder's file in a temporary directory), bucket ``scale``."""
    sys.path.insert(0, HERE)
    from bench_handoff import s3_server

    return s3_server(tempfile.mkdtemp(prefix="mcc-moto-"), bucket="scale")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", default=ROOT)
    parser.add_argument("--layout", default="directory")
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--work", default="")
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--segments-sizes", default="1000,10000,100000")
    parser.add_argument("--s3-sizes", default="1000,10000")
    parser.add_argument("--before", default="", help="an earlier checkout to measure beside this one")
    parser.add_argument("--before-layouts", default="directory,segments",
                        help="the layouts the earlier checkout is measured on (on moto's S3 it did not finish 1,000 "
                             "rollouts within 15 minutes here)")
    parser.add_argument("--layouts", default="directory,segments,s3")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    trees = [("after", ROOT)] + ([("before", os.path.abspath(args.before))] if args.before else [])
    server = None
    results: dict = {}
    try:
        for layout in args.layouts.split(","):
            sizes = {"directory": args.sizes, "segments": args.segments_sizes, "s3": args.s3_sizes}[layout]
            if layout == "s3":
                _, server = s3_endpoint()
            for size in [int(size) for size in sizes.split(",") if size]:
                for label, tree in trees:
                    if label == "before" and layout not in args.before_layouts.split(","):
                        continue
                    results[(layout, size, label)] = result = run(tree, layout, size, dict(os.environ))
                    print(f"{layout} {size:,} {label}: " + (result.get("error") or
                          " ".join(f"{key} {statistics.median(values) * 1000:.1f} ms"
                                   for key, values in result["figures"].items() if values)), flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    # Kept by layout, size and checkout: a run of some layouts or sizes replaces only those.
    kept_path = os.path.join(HERE, "results", "scale.json")
    kept = {}
    if os.path.exists(kept_path):
        with open(kept_path, encoding="utf-8") as handle:
            kept = {tuple(key.split("|")[:1]) + (int(key.split("|")[1]), key.split("|")[2]): value
                    for key, value in json.load(handle).items()}
    kept.update(results)
    with open(kept_path, "w", encoding="utf-8") as handle:
        json.dump({f"{layout}|{size}|{label}": value for (layout, size, label), value in sorted(kept.items())}, handle)
    table = render(kept, [(label, None) for label in ("after", "before")
                          if any(key[2] == label for key in kept)])
    print(table)
    with open(os.path.join(HERE, "results", "scale.md"), "w", encoding="utf-8") as handle:
        handle.write(table)


def render(results: dict, trees: list) -> str:
    ms = lambda result, key: (f"{statistics.median(result['figures'][key]) * 1000:,.1f}"  # noqa: E731
                              if "figures" in result and result["figures"][key] else result.get("error", "-")[:40])
    lines = ["# The hand-off at a long run's scale (medians of 3 rounds; the restart: one)", "",
             f"History made as the code leaves it: rollouts ended {RATE:.0f} a second, consumed in steps of {STEP} "
             f"(take, ack with a step, commit); then {ROUNDS} rounds of {BATCH} new rollouts ended and taken, "
             "acknowledged and committed, and a restart's first take (a new Consumer, rewind, take). Milliseconds.", ""]
    for layout in ("directory", "segments", "s3"):
        rows = sorted({size for (place, size, _) in results if place == layout})
        if not rows:
            continue
        labels = [label for label, _ in trees]
        lines += [f"## {layout}", "",
                  "| consumed | " + " | ".join(f"{what} ({label})" for what in
                                                 ("take 64 + ack + commit", "restart's first take", "counts()")
                                                 for label in labels) + " |",
                  "|---:|" + "---:|" * (3 * len(labels))]
        for size in rows:
            cells = []
            for key in ("cycle", "restart", "counts"):
                for label in labels:
                    cells.append(ms(results.get((layout, size, label), {"error": "-"}), key))
            lines.append(f"| {size:,} | " + " | ".join(cells) + " |")
        lines.append("")
        after = {size: results.get((layout, size, "after"), {}) for size in rows}
        if layout == "s3" and any(result.get("requests") for result in after.values()):
            lines += ["Requests per operation at moto's server (this code): LIST / GET / PUT", "",
                      "| consumed | take 64 | ack | commit | counts() | restart's first take | idle uploader round |",
                      "|---:|---|---|---|---|---|---|"]
            for size, result in after.items():
                found = result.get("requests") or {}
                cell = lambda key, found=found: "/".join(str(found.get(key, {}).get(kind, "-"))  # noqa: E731
                                                         for kind in ("LIST", "GET", "PUT"))
                lines.append(f"| {size:,} | {cell('take')} | {cell('ack')} | {cell('commit')} | {cell('counts')} | "
                             f"{cell('restart')} | {cell('idle uploader round')} |")
            lines.append("")
            lines += _million(after[max(after)].get("requests") or {}, max(after))
    return "\n".join(lines) + "\n"


#: What a million rollouts' hand-off is priced for (assumed, said in the table): 8 sidecars, each
#: uploader's round twice a second for the run (rollouts ending RATE a second), and about 120 KB
#: captured per rollout (a few turns after a long task, token ids on).
SIDECARS, ROUNDS_PER_SECOND, BYTES_PER_ROLLOUT = 8, 2.0, 120_000


def _million(found: dict, measured_at: int) -> list[str]:
    """A million rollouts' requests and their price, from the counts measured per operation."""
    if not all(key in found for key in ("end", "take", "ack", "commit", "idle uploader round")):
        return []
    rollouts = 1_000_000
    per_rollout = {kind: sum(found[key][kind] for key in ("end", "take", "ack", "commit")) / BATCH
                   for kind in ("LIST", "GET", "PUT")}
    seconds = rollouts / RATE
    idle = {kind: found["idle uploader round"][kind] * seconds * ROUNDS_PER_SECOND * SIDECARS
            for kind in ("LIST", "GET", "PUT")}
    total = {kind: per_rollout[kind] * rollouts + idle[kind] for kind in per_rollout}
    price = sum(total[kind] / 1000 * PRICE_PER_1000[kind] for kind in total)
    gigabytes = rollouts * BYTES_PER_ROLLOUT / 1e9
    return ["A million rollouts' hand-off on S3, from the counts above (measured with "
            f"{measured_at:,} consumed; flat, so the same at any size): each rollout's end and its share of a "
            f"take of {BATCH}, its ack and commit, plus {SIDECARS} sidecars' uploaders idling "
            f"{ROUNDS_PER_SECOND:g} rounds a second for the run ({seconds / 3600:.1f} h at {RATE:.0f} ends a second). "
            "Prices: AWS S3 Standard us-east-1 (https://aws.amazon.com/s3/pricing/): LIST and PUT $0.005, "
            "GET $0.0004 per 1,000.", "",
            "| | LIST | GET | PUT | price |", "|---|---:|---:|---:|---:|",
            f"| per rollout (end, take, ack, commit) | {per_rollout['LIST']:.2f} | {per_rollout['GET']:.2f} | "
            f"{per_rollout['PUT']:.2f} | |",
            f"| idle uploaders, the run | {idle['LIST']:,.0f} | {idle['GET']:,.0f} | {idle['PUT']:,.0f} | |",
            f"| a million rollouts | {total['LIST']:,.0f} | {total['GET']:,.0f} | {total['PUT']:,.0f} | ${price:,.2f} |",
            "",
            f"Beside the bytes captured: {gigabytes:,.0f} GB at an assumed {BYTES_PER_ROLLOUT // 1000} KB a rollout, "
            f"${gigabytes * 0.023:,.2f} a month stored (S3 Standard, $0.023 per GB-month).", ""]


if __name__ == "__main__":
    main()
