"""The live hand-off across processes and layouts (docs/reading.md, "Consuming rollouts during the
run"): three sidecar processes (a real S3 server on loopback, ``segments://`` on a path, the shared
per-rollout directory) record token-mode rollouts re-pinned between them, ended with a reward;
two trainer processes sharing one consumer name take, ack with steps and commit while the rollouts
run, SIGKILLed at random points and restarted from their checkpoint; a sidecar is SIGKILLed after
answering an end. Afterwards every ended rollout is in exactly one committed step, with all its
acknowledged calls, its outcome, and the trajectories `records.trajectories` builds; a second name
gets them all too. Also: a store that ignores conditional puts is refused; a sidecar that went
silent holding a rollout's calls holds it back for the writer bound, then it is ``incomplete``."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

import aiohttp
import orjson
import pytest

from records import Consumer, trajectories
from records.contract import ObjectStore
from records.contract.reading import read_watermarks, rollout_readiness
from records.training import ExclusiveCreateBroken
from tests.processes import SidecarProcess
from tests.wire import RUNNER, RUNNER_TOKEN

from tests import CHECKOUT, soak_or

ROOT = CHECKOUT
#: Rollouts of the three-sidecar run (on S3 fewer in `make test`: `soak_or`).
ROLLOUTS = 200

@pytest.fixture
def s3_server(monkeypatch, tmp_path):
    """moto's S3 server on loopback, in a process of its own (six processes talk to it at once; in
    the test's own process it would share the interpreter's lock with the agents it drives)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    import boto3

    deadline = time.monotonic() + 30
    while True:
        try:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="captures")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    yield endpoint
    server.terminate()
    server.wait(timeout=30)


_TRAINER = r'''
import fcntl, json, os, random, signal, sys
sys.path.insert(0, sys.argv[1])
from records import Consumer, LeaseLost
captures, name, shared, seed, dies = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6] == "dies"
expected = int(sys.argv[7])
rng = random.Random(seed)

def maybe_die():
    # SIGKILLed at a random point between take, ack, checkpoint and commit.
    if dies and rng.random() < 0.05:
        os.kill(os.getpid(), signal.SIGKILL)

def load(path, default):
    return json.load(open(path)) if os.path.exists(path) else default

def save(path, value):
    with open(path + ".tmp", "w") as handle:
        json.dump(value, handle); handle.flush(); os.fsync(handle.fileno())
    os.replace(path + ".tmp", path)

checkpoint, pending = os.path.join(shared, "checkpoint.json"), os.path.join(shared, "pending.json")
# Two ranks of one trainer: each takes on its own; the step, the ack and the checkpoint are taken
# in turn under a lock (a data-parallel trainer's steps are global and advance in order).
consumer = Consumer(captures, name, lease_seconds=2.0, join=True)  # The ranks join the job's incarnation
while True:
    items = consumer.take(rng.randint(1, 4), wait=0.2)
    ids = [item.rollout_id for item in items]
    assert len(ids) == len(set(ids)), ids
    maybe_die()
    with open(os.path.join(shared, "lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = load(checkpoint, {"step": 0, "trained": []})
        work = load(pending, {"next": 1, "pairs": []})
        if work.get("in_progress"):
            sys.exit(3)  # The other rank died within a step: the trainer stops (a collective fails).
        if items:
            step = work["next"]
            # The step is taken and marked under way first: a rank that dies within it leaves the
            # mark, so no other rank commits past its unrecorded ack (steps are never reused).
            work.update(next=step + 1, in_progress=step)
            save(pending, work)
            maybe_die()
            try:
                consumer.ack(items, step=step)
                lost = []
            except LeaseLost as refused:
                lost = refused.lost  # Stalled past their lease: another holder has them.
            maybe_die()
            work["pairs"] += [[step, item.rollout_id, len(item.calls), item.outcome,
                               item.trajectories.model_dump_json(), item.incomplete]
                              for item in items if item not in lost]
            work["in_progress"] = None
            save(pending, work)
            maybe_die()
        if work["pairs"] and (not items or rng.random() < 0.3):
            step = work["next"] - 1
            # A rank killed between its checkpoint's save and the pending pairs' clearing leaves them
            # in both: the other rank, still running until it is stopped, must not record them twice.
            saved = {(pair[0], pair[1]) for pair in state["trained"]}
            save(checkpoint, {"step": step, "trained": state["trained"] + [pair for pair in work["pairs"]
                                                                           if (pair[0], pair[1]) not in saved]})
            maybe_die()
            consumer.commit(step)
            maybe_die()
            save(pending, {"next": work["next"], "pairs": [], "in_progress": None})
        if not items and not work["pairs"]:
            counts = consumer.counts()
            if counts["final"] >= expected and counts["pending"] == 0:
                break
print("done", flush=True)
'''


def _recover(captures: str, name: str, shared: str) -> None:
    """After a crash of either rank: both are stopped; the trainer restarts from its checkpoint
    (what was acknowledged after it is undone, and handed out again; the steps after it are
    not used again)."""
    checkpoint = os.path.join(shared, "checkpoint.json")
    state = json.load(open(checkpoint)) if os.path.exists(checkpoint) else {"step": 0, "trained": []}
    pending = os.path.join(shared, "pending.json")
    work = json.load(open(pending)) if os.path.exists(pending) else {"next": 1, "pairs": []}
    with open(pending, "w") as handle:
        json.dump({"next": max(work["next"], state["step"] + 1), "pairs": [], "in_progress": None}, handle)
    Consumer(captures, name).rewind(state["step"])


def _run_trainers(captures: str, name: str, shared: str, script: str, env: dict[str, str], kills_wanted: int,
                  deadline: float, rollouts: int = ROLLOUTS) -> int:
    """Two ranks, restarted together after any SIGKILL, until both finish; how many kills."""
    kills, attempt = 0, 0
    while time.monotonic() < deadline:
        attempt += 1
        dies = "dies" if kills < kills_wanted else "lives"
        ranks = [subprocess.Popen([sys.executable, script, ROOT, captures, name, shared, str(attempt * 2 + rank), dies,
                                   str(rollouts)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for rank in range(2)]
        while all(rank.poll() is None for rank in ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        codes = [rank.poll() for rank in ranks]
        if all(code == 0 for code in codes):
            return kills
        if any(code == 0 for code in codes):  # One finished: the other finishes too, or dies.
            for rank in ranks:
                try:
                    rank.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            if all(rank.poll() == 0 for rank in ranks):
                return kills
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
            rank.wait()
        failed = [rank for rank in ranks if rank.returncode not in (0, -9, 3)]
        assert not failed, failed[0].stderr.read()  # type: ignore[union-attr]
        kills += 1
        _recover(captures, name, shared)
    raise AssertionError("the trainers did not finish in time")


async def _rollout(http: aiohttp.ClientSession, sidecars: list, index: int, rng: random.Random,
                   acknowledged: dict[str, list[str]], ended: dict[str, float], cut: set[str]) -> None:
    """One agent: 2-4 calls, each to a sidecar picked at random (re-pinned), each retried elsewhere
    when its sidecar is down; then the end, with a reward, on any sidecar."""
    rollout = f"task{index % 50}-{index}"
    messages: list[dict[str, str]] = [{"role": "user", "content": f"start {index}"}]
    for turn in range(rng.randint(2, 4)):
        while True:
            sidecar = rng.choice(sidecars)
            try:
                async with http.post(f"{sidecar.url}/ng-rollout/{rollout}/v1/chat/completions",
                                     json={"model": "m", "messages": messages}) as reply:
                    if reply.status == 200:
                        content = (await reply.json())["choices"][0]["message"]["content"]
                        break
            except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
                cut.add(rollout)  # Its sidecar died under it (the call may have been dispatched).
            await asyncio.sleep(0.05)
        acknowledged.setdefault(rollout, []).append(messages[-1]["content"])
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"turn {turn} of {index}"}]
    reward = round(rng.random(), 3)
    while True:
        try:
            async with http.post(f"{rng.choice(sidecars).url}/-/rollouts/{rollout}/end",
                                 json={"outcome": {"reward": reward}}, headers=RUNNER) as reply:
                if reply.status == 200:
                    ended[rollout] = reward
                    return
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
            pass
        await asyncio.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["s3", "segments", "directory"])
async def test_three_sidecars_two_trainers_and_kills_hand_out_every_ended_rollout_once(layout, tmp_path, request,
                                                                                      monkeypatch):
    # moto answers slowly: on S3 `make test` runs 50 rollouts and kills the trainer twice; the soak, 200 and 4.
    rollouts, trainer_kills = (soak_or(50, ROLLOUTS), soak_or(2, 4)) if layout == "s3" else (ROLLOUTS, 4)
    if layout == "s3":
        request.getfixturevalue("s3_server")
        captures = "s3://captures/handoff"
    elif layout == "segments":
        captures = f"segments://{tmp_path / 'store'}"
    else:
        captures = str(tmp_path / "captures")
    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    env = {**os.environ, "MCC_ADMIN_TOKEN": RUNNER_TOKEN}  # The runner's token: ends go over HTTP.

    def start(index: int) -> SidecarProcess:
        where = (["--capture-dir", captures] if layout == "directory" else
                 ["--capture-dir", str(tmp_path / f"spool-{index}"), "--capture-store", captures])
        return SidecarProcess.start("--stand-in", "--capture-tokens", *where, env=env)

    sidecars = [start(index) for index in range(3)]
    if layout == "directory":
        os.makedirs(captures, exist_ok=True)
    script = str(tmp_path / "trainer.py")
    with open(script, "w") as handle:
        handle.write(_TRAINER)
    shared = str(tmp_path / "trainer")
    os.makedirs(shared)
    rng = random.Random(7)
    acknowledged: dict[str, list[str]] = {}
    ended: dict[str, float] = {}
    cut: set[str] = set()
    outcome: dict[str, int] = {}
    deadline = time.monotonic() + 240
    trainers = threading.Thread(target=lambda: outcome.update(kills=_run_trainers(
        captures, "trainer", shared, script, env, trainer_kills, deadline, rollouts)), daemon=True)
    trainers.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
            agents = [asyncio.create_task(_rollout(http, sidecars, index, rng, acknowledged, ended, cut))
                      for index in range(rollouts)]
            while len(ended) < rollouts // 3:
                await asyncio.sleep(0.05)
            sidecars[1].kill()  # Just after it answered ends (and while it holds calls of others).
            await asyncio.sleep(0.5)
            sidecars[1] = start(1)  # On its spool again: what it held ships now.
            await asyncio.gather(*agents)
        trainers.join(timeout=max(1.0, deadline - time.monotonic()))
        assert not trainers.is_alive(), "the trainers did not finish"
    finally:
        for sidecar in sidecars:
            sidecar.terminate()
    assert outcome["kills"] >= 1
    state = json.load(open(os.path.join(shared, "checkpoint.json")))
    steps: dict[str, list[int]] = {}
    for step, rollout_id, calls, given, build, incomplete in state["trained"]:
        steps.setdefault(rollout_id, []).append(step)
        assert calls >= len(acknowledged[rollout_id]), rollout_id  # Never short of an acknowledged call.
        assert given == {"reward": ended[rollout_id]} and not incomplete
        if rollout_id not in cut:
            # A rollout whose call was cut by the SIGKILL may gain that call's line when the killed
            # sidecar ships its spool, after a trainer took it (docs/limits.md): its build then
            # differs from the one trained; every other rollout's is the one trained.
            assert build == trajectories(captures, rollout_id).model_dump_json()
    assert sorted(steps) == sorted(ended), ("every ended rollout trained", set(ended) - set(steps), set(steps) - set(ended),
                                            len(ended), outcome)
    twice = {rollout_id: taken for rollout_id, taken in steps.items() if len(taken) != 1}
    assert not twice, f"trained twice: {twice}"
    masked = {rollout_id: orjson.loads(build)["mask_reason"] for _, rollout_id, _, _, build, _ in state["trained"]
              if orjson.loads(build)["masked"]}
    # Masked only where a call was cut by the SIGKILL (dispatched without an entry: Gym's rule).
    assert set(masked) <= cut, {rollout_id: reason for rollout_id, reason in masked.items() if rollout_id not in cut}
    # Another name gets every rollout too.
    evaluator = Consumer(captures, "eval")
    seen: list[str] = []
    while True:
        items = evaluator.take(50)
        if not items:
            break
        seen += [item.rollout_id for item in items]
        evaluator.ack(items)
    assert sorted(seen) == sorted(ended)


class _StrippingProxy:
    """An HTTP proxy on loopback that drops ``If-None-Match`` from every request: an S3-compatible
    server that takes the header and ignores it, as some do."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))

        def back() -> None:
            try:
                while data := upstream.recv(65536):
                    client.sendall(data)
            except OSError:
                pass
            client.close()

        threading.Thread(target=back, daemon=True).start()
        buffer, body_left = b"", 0
        try:
            while data := client.recv(65536):
                buffer += data
                while buffer:
                    if body_left:  # A body as it comes (after an ``Expect: 100-continue`` too).
                        sent = buffer[:body_left]
                        upstream.sendall(sent)
                        body_left -= len(sent)
                        buffer = buffer[len(sent):]
                        continue
                    if b"\r\n\r\n" not in buffer:
                        break
                    head, _, buffer = buffer.partition(b"\r\n\r\n")  # The head, the header left out.
                    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"if-none-match:")]
                    body_left = next((int(line.split(b":", 1)[1]) for line in lines
                                      if line.lower().startswith(b"content-length:")), 0)
                    upstream.sendall(b"\r\n".join(lines) + b"\r\n\r\n")
        except OSError:
            pass
        upstream.close()


def test_a_store_that_ignores_conditional_puts_is_refused_at_start(s3_server, monkeypatch):
    """Behind a proxy that strips ``If-None-Match``, a second create of one object succeeds: the
    consumer refuses to run there, in one sentence; straight to the server it runs."""
    Consumer("s3://captures/probe", "trainer")
    proxy = _StrippingProxy(int(s3_server.rsplit(":", 1)[1]))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
    with pytest.raises(ExclusiveCreateBroken, match="did not fail the second time"):
        Consumer("s3://captures/probe", "trainer")


@pytest.mark.slow
async def test_a_silent_sidecar_holding_a_rollouts_calls_holds_it_back_then_it_is_incomplete(tmp_path, monkeypatch):
    """A sidecar SIGKILLed with a rollout's call in its spool (its segment not sealed, the end not
    seen): the rollout is held back while the bound runs, then handed out ``incomplete`` without
    that call; a rollout it held nothing of and that ended after it went silent past the bound is
    not held. A sidecar that comes back within the bound ships the call: complete."""
    captures = f"segments://{tmp_path / 'store'}"
    env = {"MCC_STORE_CACHE": str(tmp_path / "cache"), "MCC_ADMIN_TOKEN": RUNNER_TOKEN}
    monkeypatch.setenv("MCC_STORE_CACHE", env["MCC_STORE_CACHE"])
    one, two = (SidecarProcess.start("--stand-in", "--capture-dir", str(tmp_path / f"spool-{i}"), "--capture-store",
                                     captures, env=env) for i in range(2))
    try:
        async with aiohttp.ClientSession() as http:
            for sidecar in (one, two):
                async with http.post(f"{sidecar.url}/ng-rollout/held/v1/chat/completions",
                                     json={"model": "m", "messages": [{"role": "user", "content": "x"}]}) as reply:
                    assert reply.status == 200
            await asyncio.sleep(1.0)  # Both have put their watermarks.
            one.kill()
            async with http.post(f"{two.url}/-/rollouts/held/end", json={}, headers=RUNNER) as reply:
                assert reply.status == 200
            consumer = Consumer(captures, "trainer", writer_bound_seconds=3.0)
            started = time.monotonic()
            items: list = []
            while not items and time.monotonic() - started < 10:
                items = consumer.take(1, wait=0.2)
            waited = time.monotonic() - started
            assert [item.rollout_id for item in items] == ["held"] and items[0].incomplete
            assert len(items[0].calls) == 1 and waited >= 1.5  # Held back, then handed out without its lost call.
            await asyncio.sleep(3.5)  # Past the bound after the silent sidecar's last word.
            async with http.post(f"{two.url}/ng-rollout/later/v1/chat/completions",
                                 json={"model": "m", "messages": [{"role": "user", "content": "y"}]}) as reply:
                assert reply.status == 200
            async with http.post(f"{two.url}/-/rollouts/later/end", json={}, headers=RUNNER) as reply:
                assert reply.status == 200
            later = consumer.take(1, wait=5.0)
            assert [item.rollout_id for item in later] == ["later"] and not later[0].incomplete
            # The silent sidecar comes back on its spool: the lost call ships, and a new name gets it whole.
            one = SidecarProcess.start("--stand-in", "--capture-dir", str(tmp_path / "spool-0"), "--capture-store",
                                       captures, env=env)
            await asyncio.sleep(1.5)  # Its first rounds: the spool shipped, its watermark put.
            fresh = Consumer(captures, "eval", writer_bound_seconds=3.0)
            whole = fresh.take(2, wait=5.0)
            assert {item.rollout_id: (len(item.calls), item.incomplete) for item in whole} == {
                "held": (2, False), "later": (1, False)}
    finally:
        one.terminate()
        two.terminate()


def test_a_sidecar_is_a_known_writer_before_its_first_call(tmp_path, monkeypatch):
    """A sidecar with a store puts its spool's writer object before it serves (watermark 0, nothing
    seen): a rollout ended the moment it is up waits for its first round. Before, a consumer that
    knew no writer of a new sidecar handed out a rollout without the calls made there (seen in the
    three-sidecars run as the first rollout trained with 1 of its 3 acknowledged calls)."""
    store = tmp_path / "store"
    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    sidecar = SidecarProcess.start("--stand-in", "--capture-dir", str(tmp_path / "spool"), "--capture-store",
                                   f"segments://{store}")
    try:
        watermarks = read_watermarks(ObjectStore(f"segments://{store}"))  # At once: no call made, no round waited for.
        assert [writer["spool"] for writer in watermarks] == [open(tmp_path / "spool" / ".spool-id").read()]
        now = time.time()
        assert rollout_readiness(watermarks, "r1", ended_at=now, now=now, writer_bound=60.0) == "wait"
    finally:
        sidecar.terminate()


def test_mcc_feed_and_consumers_on_a_store_url(tmp_path, monkeypatch):
    """`mcc feed STORE --group-size 2 --ack` prints each whole group as one JSON line; `mcc
    consumers STORE` counts them acknowledged, with the stale and partial columns."""
    from click.testing import CliRunner

    from proxy import main
    from records import end_rollout

    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    store = f"segments://{tmp_path / 'store'}"
    for index in range(4):
        end_rollout(store, f"task{index // 2}-{index % 2}", outcome={"reward": index}, allow_empty=True)
    fed = CliRunner().invoke(main, ["feed", store, "--consumer", "eval", "--group-size", "2", "--ack"], prog_name="mcc")
    assert fed.exit_code == 0, fed.output
    groups = [orjson.loads(line) for line in fed.output.splitlines()]
    assert [(group["group"], [rollout["rollout_id"] for rollout in group["rollouts"]], group["partial"])
            for group in groups] == [("task0", ["task0-0", "task0-1"], False), ("task1", ["task1-0", "task1-1"], False)]
    listed = CliRunner().invoke(main, ["consumers", store, "--json"], prog_name="mcc")
    assert listed.exit_code == 0, listed.output
    row, run = map(orjson.loads, listed.output.splitlines())
    assert run["run"]["ended_rollouts"] == 4 and run["run"]["side_calls"] is None, "(a store's lines are not scanned)"
    assert (row["consumer"], row["final"], row["waiting"], row["stale"], row["partial"]) == ("eval", 4, 0, 0, 0)
    table = CliRunner().invoke(main, ["consumers", store], prog_name="mcc")
    assert table.output.splitlines()[0].split()[-4:] == ["stale", "partial", "oldest", "waiting"]
