"""The durable consumer of ended rollouts (issue 62, item 3, on a capture directory): leases with
epochs, acknowledgements tied to the trainer's checkpoint, names independent; real processes
SIGKILLed at random points lose nothing and train nothing twice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import orjson
import pytest

from records import Consumer, LeaseLost, end_rollout
from records.training import consumer_view

from tests import CHECKOUT

ROOT = CHECKOUT


def _ended(directory: str, count: int, prefix: str = "r") -> list[str]:
    ids = [f"{prefix}{n:03d}" for n in range(count)]
    for n, rollout_id in enumerate(ids):
        end_rollout(directory, rollout_id, outcome={"reward": n / count}, allow_empty=True)
    return ids


def test_take_hands_out_oldest_end_first_each_to_one_holder_and_names_are_independent(tmp_path):
    directory = str(tmp_path)
    ids = _ended(directory, 5)
    one = Consumer(directory, "trainer")
    two = Consumer(directory, "trainer", join=one.incarnation)  # Two ranks of one job
    first = one.take(2)
    assert [item.rollout_id for item in first] == ids[:2], "oldest end first"
    assert [item.outcome for item in first] == [{"reward": 0.0}, {"reward": 0.2}]
    assert [item.rollout_id for item in two.take(10)] == ids[2:], "one holder at a time"
    assert one.take(10) == [] and one.take(1, wait=0.3) == []
    assert [item.rollout_id for item in Consumer(directory, "eval-logger").take(10)] == ids, "another name gets all"
    assert all(item.lease.epoch == 1 and item.trajectories.rollout_id == item.rollout_id for item in first)


def test_a_stalled_holders_lease_runs_out_and_its_late_ack_is_refused(tmp_path):
    directory = str(tmp_path)
    (rollout_id,) = _ended(directory, 1)
    stalled = Consumer(directory, "trainer", lease_seconds=0.2)
    other = Consumer(directory, "trainer", join=stalled.incarnation)  # A rank of the same job
    (held,) = stalled.take()
    assert other.take() == [], "leased"
    time.sleep(0.3)
    (again,) = other.take()
    assert again.rollout_id == rollout_id and again.lease.epoch > held.lease.epoch, "the next epoch"
    other.ack([again], step=None)
    for late in (lambda: stalled.ack([held], step=None), lambda: stalled.extend([held]), lambda: stalled.release([held])):
        with pytest.raises(LeaseLost):
            late()
    assert other.counts() == {"final": 1, "pending": 0, "leased": 0, "waiting": 0, "dropped": 0, "stale": 0, "partial": 0, "unended": 0}


def test_a_lease_that_ran_out_holds_while_nobody_took_it_again_and_extend_and_release_work(tmp_path):
    directory = str(tmp_path)
    _ended(directory, 2)
    consumer = Consumer(directory, "trainer", lease_seconds=0.2)
    slow, released = consumer.take(2)
    consumer.extend([slow])
    consumer.release([released])
    assert [item.rollout_id for item in Consumer(directory, "trainer", join=True).take(5)] == [released.rollout_id]
    time.sleep(0.3)
    consumer.ack([slow], step=None)  # Ran out, but no later epoch: still its holder's.


def test_acks_follow_the_trainers_checkpoint(tmp_path):
    """ack(step) is pending until commit(>= step); rewind(T) hands out again what was acked after T
    and not committed; a committed ack survives a later rewind; step=None is final at once;
    dropped rollouts are acknowledged and counted apart."""
    directory = str(tmp_path)
    ids = _ended(directory, 6)
    trainer = Consumer(directory, "trainer")
    items = {item.rollout_id: item for item in trainer.take(6)}
    trainer.ack([items[ids[0]]], step=1)
    trainer.ack([items[ids[1]]], step=2)
    trainer.ack([items[ids[2]]], step=3, dropped=True)
    trainer.ack([items[ids[3]]], step=None)
    assert trainer.counts() == {"final": 1, "pending": 3, "leased": 2, "waiting": 0, "dropped": 1, "stale": 0, "partial": 0, "unended": 0}
    trainer.commit(2)
    assert trainer.counts()["final"] == 3 and trainer.counts()["pending"] == 1
    trainer.rewind(2)  # Restarted from the checkpoint at step 2: step 3's ack is undone.
    restarted = Consumer(directory, "trainer")
    # The restart fences the old incarnation: what it held and never acknowledged comes back at once.
    assert [item.rollout_id for item in restarted.take(6)] == [ids[2], ids[4], ids[5]]
    assert restarted.counts() == {"final": 3, "pending": 0, "leased": 3, "waiting": 0, "dropped": 0, "stale": 0, "partial": 0, "unended": 0}
    with pytest.raises(ValueError):
        restarted.ack([items[ids[4]]], step=-1)


# -- real processes, SIGKILLed ---------------------------------------------------------------------

_TRAINER = r'''
import json, os, random, signal, sys
sys.path.insert(0, sys.argv[1])
from records import Consumer, LeaseLost
directory, name, checkpoint, seed, dies = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6] == "dies"
rng = random.Random(seed)

def maybe_die():
    # SIGKILLed at a random point between take, ack, checkpoint and commit.
    if dies and rng.random() < 0.08:
        os.kill(os.getpid(), signal.SIGKILL)

def save(state):
    # The trainer's checkpoint: its step and what it trained on up to it, made durable first.
    tmp = checkpoint + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(state, handle); handle.flush(); os.fsync(handle.fileno())
    os.replace(tmp, checkpoint)

state = json.load(open(checkpoint)) if os.path.exists(checkpoint) else {"step": 0, "trained": []}
consumer = Consumer(directory, name, lease_seconds=1.0)
consumer.rewind(state["step"])  # Restarted from the last checkpoint.
step, since = state["step"], []
while True:
    items = consumer.take(rng.randint(1, 4), wait=0.3)
    maybe_die()
    if items:
        step += 1
        try:
            consumer.ack(items, step=step)
            lost = []
        except LeaseLost as refused:
            lost = refused.lost  # Stalled past their lease: another holder has them.
        since += [[step, item.rollout_id] for item in items if item not in lost]  # Trained on at this step.
        maybe_die()
    if since and (not items or step % 3 == 0 or rng.random() < 0.2):
        state = {"step": step, "trained": state["trained"] + since}
        save(state)
        maybe_die()
        consumer.commit(step)
        since = []
        maybe_die()
    if not items and not since:
        counts = consumer.counts()
        if counts["waiting"] == 0 and counts["leased"] == 0 and counts["pending"] == 0:
            break
print("done", flush=True)
'''


@pytest.mark.slow
def test_a_trainer_killed_at_random_points_trains_every_rollout_in_exactly_one_committed_step(tmp_path):
    """A checkpointing trainer SIGKILLed at random points (between take, ack, checkpoint and commit),
    restarted each time with `rewind` to its last checkpoint: afterwards every ended rollout is in
    exactly one step of its checkpoint (none lost, none trained twice), the name's acks are all
    final, and another name still gets every rollout."""
    directory = str(tmp_path / "captures")
    os.makedirs(directory)
    ids = _ended(directory, 60)
    checkpoint = str(tmp_path / "checkpoint.json")
    kills = 0
    for attempt in range(60):
        dies = "dies" if kills < 8 else "lives"
        done = subprocess.run([sys.executable, "-c", _TRAINER, ROOT, directory, "trainer", checkpoint, str(attempt), dies],
                              capture_output=True, text=True, timeout=120)
        if done.returncode == -signal.SIGKILL:
            kills += 1
            continue
        assert done.returncode == 0 and "done" in done.stdout, done.stderr
        break  # Finished: every ended rollout is acknowledged for good.
    else:
        pytest.fail("the trainer never finished")
    assert kills >= 4, "the trainer was killed at random points several times"
    trained = [rollout_id for _, rollout_id in json.load(open(checkpoint))["trained"]]
    assert sorted(trained) == ids, "every ended rollout exactly once as of the checkpoint: none lost, none twice"
    assert consumer_view(directory, "trainer").counts() == {"final": 60, "pending": 0, "leased": 0, "waiting": 0,
                                                       "dropped": 0, "stale": 0, "partial": 0, "unended": 0}
    assert len(Consumer(directory, "another").take(100)) == 60


@pytest.mark.slow
async def test_a_consumer_that_retires_marks_gyms_state_only_once_its_ack_is_final(http, upstream, start, capture_dir):
    from records.contract import TokenFiles
    from tests.proxy.training.test_token_files import converse, serve_model
    from tests.vllm_chat_model import TinyChatModel

    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    await converse(http, sidecar, "tok-a", ["hi", "more"])
    await converse(http, sidecar, "tok-b", ["hi"])
    for rollout_id in ("tok-a", "tok-b"):
        end_rollout(capture_dir, rollout_id, outcome={"reward": 1}, allow_empty=True)
    await asyncio.sleep(0.3)  # The sidecar publishes, after the ends, that no call is in flight (the write barrier).
    trainer = Consumer(capture_dir, "trainer", retires=True)
    loop = asyncio.get_running_loop()  # (taken on a thread: the sidecar runs on this loop)
    first, second = await loop.run_in_executor(None, trainer.take, 2)
    assert first.trajectories.chains and not first.trajectories.masked and len(first.calls) == 2
    files = TokenFiles(capture_dir)
    trainer.ack([first], step=1)
    assert not files.state("tok-a")["retired"], "pending until the checkpoint"
    trainer.commit(1)
    assert files.state("tok-a")["retired"] and files.state("tok-a")["frozen"]
    trainer.ack([second])  # No step: final at once.
    assert files.state("tok-b")["retired"]


def test_mcc_consumers_and_feed(tmp_path):
    from click.testing import CliRunner

    from proxy import main

    directory = str(tmp_path)
    ids = _ended(directory, 3)
    trainer = Consumer(directory, "trainer")
    trainer.ack(trainer.take(1), step=4)
    fed = CliRunner().invoke(main, ["feed", directory, "--consumer", "eval", "--max", "2", "--ack"], prog_name="mcc")
    assert fed.exit_code == 0, fed.output
    lines = [orjson.loads(line) for line in fed.output.splitlines()]
    assert [line["rollout_id"] for line in lines] == ids[:2] and lines[0]["outcome"] == {"reward": 0.0}
    listed = CliRunner().invoke(main, ["consumers", directory, "--json"], prog_name="mcc")
    assert listed.exit_code == 0, listed.output
    by_name = {row["consumer"]: row for row in map(orjson.loads, listed.output.splitlines()) if "consumer" in row}
    assert (by_name["eval"]["final"], by_name["eval"]["waiting"]) == (2, 1)
    assert (by_name["trainer"]["pending"], by_name["trainer"]["waiting"]) == (1, 2)
    assert by_name["trainer"]["oldest_waiting_age_s"] >= 0
    table = CliRunner().invoke(main, ["consumers", directory], prog_name="mcc")
    assert table.output.splitlines()[0].split()[:2] == ["consumer", "acked"]
    assert table.output.splitlines()[-1].startswith("run: going on; 3 rollout(s) ended, 0 unended")
    bad = CliRunner().invoke(main, ["feed", directory, "--consumer", "no spaces"], prog_name="mcc")
    assert bad.exit_code == 2 and bad.output.startswith("mcc: ") and "consumer name" in bad.output


def test_groups_are_handed_out_sealed_as_one_item(tmp_path):
    """Declared sizes and Gym ids: a group is one item once its size of members ended (the latest
    attempt of each), leased and acknowledged together; a group still short is held back."""
    from records import FinishedGroup, FinishedRollout

    directory = str(tmp_path)
    end_rollout(directory, "alone", outcome={"reward": 1}, allow_empty=True)
    for member in ("a", "b", "c"):
        end_rollout(directory, f"g1-{member}", outcome={"reward": 0.5}, group="g1", group_size=3, allow_empty=True)
    end_rollout(directory, "g2-a", group="g2", group_size=3, allow_empty=True)
    for rollout_id in ("17-0", "17-1", "17-1-a1", "18-0"):
        end_rollout(directory, rollout_id, allow_empty=True)
    trainer = Consumer(directory, "trainer")
    items = trainer.take(10, group_size=2)
    assert [type(item) for item in items] == [FinishedRollout, FinishedGroup, FinishedGroup]
    alone, g1, task17 = items
    assert alone.rollout_id == "alone"
    assert g1.group == "g1" and [r.rollout_id for r in g1.rollouts] == ["g1-a", "g1-b", "g1-c"] and not g1.partial
    assert task17.group == "17" and sorted(r.rollout_id for r in task17.rollouts) == ["17-0", "17-1-a1"], "latest attempt"
    assert all(r.lease == g1.lease for r in g1.rollouts)
    assert Consumer(directory, "trainer", join=True).take(10, group_size=2) == [], "g2 and task 18 are short; the rest are leased"
    trainer.ack([g1, task17], step=None)
    trainer.ack([alone])
    assert trainer.counts() == {"final": 6, "pending": 0, "leased": 0, "waiting": 2, "dropped": 0, "stale": 0, "partial": 0, "unended": 0}, "17-1 is superseded"


def test_a_short_group_is_handed_out_partial_after_the_straggler_bound_naming_who_is_missing(tmp_path):
    directory = str(tmp_path)
    end_rollout(directory, "18-0", allow_empty=True)
    end_rollout(directory, "18-2", allow_empty=True)
    trainer = Consumer(directory, "trainer", straggler_seconds=0.3)
    assert trainer.take(5, group_size=4) == []
    (group,) = trainer.take(5, group_size=4, wait=2.0)
    assert group.partial and group.missing == ["18-1", "18-3"] and len(group.rollouts) == 2
    trainer.ack([group])
    assert (trainer.counts()["partial"], trainer.counts()["final"]) == (2, 2), "each member counted partial"


def test_a_groups_lease_runs_out_as_one_and_two_ends_of_one_group_agree_on_its_size(tmp_path):
    from records import GroupSizeConflict

    directory = str(tmp_path)
    end_rollout(directory, "g-0", group="g", group_size=2, allow_empty=True)
    with pytest.raises(GroupSizeConflict):
        end_rollout(directory, "g-1", group="g", group_size=3, allow_empty=True)
    end_rollout(directory, "g-1", group="g", group_size=2, allow_empty=True)
    stalled = Consumer(directory, "trainer", lease_seconds=0.2)
    (held,) = stalled.take()
    time.sleep(0.3)
    (again,) = Consumer(directory, "trainer", join=True).take()
    assert again.lease.epoch > held.lease.epoch and [r.rollout_id for r in again.rollouts] == ["g-0", "g-1"]
    with pytest.raises(LeaseLost):
        stalled.ack([held])


@pytest.mark.slow
async def test_staleness_after_three_declared_versions_per_member(http, upstream, start, capture_dir):
    """Rollouts sampled under v1, v2 and v3 (declared by the trainer, in that order); taken with
    current_version v3 and max_staleness 1: staleness 2, 1 and 0, the first marked stale, none
    withheld; a group's members each marked; the trainer acknowledges what it drops."""
    from tests.proxy.training.test_token_files import converse, serve_model
    from tests.vllm_chat_model import TinyChatModel
    from tests.wire import RUNNER, fetch

    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    for version, rollouts in (("v1", ["5-0"]), ("v2", ["5-1", "solo-b"]), ("v3", ["solo-c"])):
        declared = await fetch(http, "POST", sidecar.url + "/-/weight-version", orjson.dumps({"version": version}),
                               headers=RUNNER)
        assert declared.status == 200
        for rollout_id in rollouts:
            await converse(http, sidecar, rollout_id, ["hi"])
    for rollout_id in ("5-0", "5-1", "solo-b", "solo-c"):
        end_rollout(capture_dir, rollout_id, outcome={"reward": 1}, allow_empty=True)
    await asyncio.sleep(0.3)  # The sidecar publishes, after the ends, that no call is in flight (the write barrier).
    trainer = Consumer(capture_dir, "trainer")
    items = await asyncio.get_running_loop().run_in_executor(  # (on a thread: the sidecar runs on this loop)
        None, lambda: trainer.take(10, group_size=2, current_version="v3", max_staleness=1))
    by_id = {}
    for item in items:
        for rollout in getattr(item, "rollouts", [item]):
            by_id[rollout.rollout_id] = rollout
    assert {rollout_id: (r.staleness, r.stale) for rollout_id, r in by_id.items()} == {
        "5-0": (2, True), "5-1": (1, False), "solo-b": (1, False), "solo-c": (0, False)}
    assert by_id["5-0"].weight_versions["start"] == "v1" and by_id["5-0"].weight_versions["tokens"]["v1"] > 0
    group = next(item for item in items if hasattr(item, "rollouts"))
    trainer.ack([group], dropped=True)  # Too stale: dropped, and said so.
    trainer.ack([item for item in items if item is not group])
    assert trainer.counts()["dropped"] == 2 and trainer.counts()["final"] == 4
    assert trainer.counts()["stale"] == 2, "the group with a stale member: both members handed out stale"


def test_an_ack_of_several_applies_every_held_lease_and_names_the_lost_ones(tmp_path):
    directory = str(tmp_path)
    _ended(directory, 2)
    holder = Consumer(directory, "trainer", lease_seconds=0.3)
    kept, lost = holder.take(2)
    holder.extend([kept])
    time.sleep(0.35)
    holder.extend([kept])
    (retaken,) = Consumer(directory, "trainer", join=True).take(5)
    assert retaken.rollout_id == lost.rollout_id
    with pytest.raises(LeaseLost) as refused:
        holder.ack([kept, lost], step=None)
    assert refused.value.lost == [lost]
    assert holder.counts()["final"] == 1 and holder.counts()["leased"] == 1


def test_a_record_left_empty_by_a_writer_that_died_stands_for_nothing(tmp_path):
    """A writer killed between its create and its write leaves an empty slot: while young, readers
    wait for it; once old, the item is taken at the next slot."""
    directory = str(tmp_path)
    (rollout_id,) = _ended(directory, 1)
    consumer = Consumer(directory, "trainer")
    empty = os.path.join(directory, "consumers", "trainer", "items", f"{rollout_id}.{1:010d}.json")
    open(empty, "wb").close()
    assert Consumer(directory, "trainer", join=True).take() == [], "being written"
    old = time.time() - 60
    os.utime(empty, (old, old))
    (item,) = consumer.take()
    assert item.rollout_id == rollout_id and item.lease.epoch == 2


async def test_staleness_without_the_token_mode_comes_from_the_lines_declared_versions(http, upstream, start,
                                                                                       capture_dir):
    """No token records: the versions the trainer declared, on each line, say which weights
    generated a rollout, and its staleness is counted from them (the source said: ``lines``)."""
    from tests.proxy.training.test_token_files import converse, serve_model
    from tests.vllm_chat_model import TinyChatModel
    from tests.wire import RUNNER, fetch

    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir)  # Capture on, no token mode.
    for version, rollout_id in (("v1", "old"), ("v2", "newer"), ("v3", None)):
        declared = await fetch(http, "POST", sidecar.url + "/-/weight-version", orjson.dumps({"version": version}),
                               headers=RUNNER)
        assert declared.status == 200
        if rollout_id:
            await converse(http, sidecar, rollout_id, ["hi", "more"])
    loop = asyncio.get_running_loop()
    for rollout_id in ("old", "newer"):
        await loop.run_in_executor(None, lambda rollout_id=rollout_id: end_rollout(capture_dir, rollout_id))
    trainer = Consumer(capture_dir, "trainer")
    items = await loop.run_in_executor(None, lambda: trainer.take(2, wait=3.0, current_version="v3", max_staleness=1))
    items += await loop.run_in_executor(None, lambda: trainer.take(2, wait=1.0 if len(items) < 2 else 0.0,
                                                                   current_version="v3", max_staleness=1))
    by_id = {item.rollout_id: item for item in items}
    assert {rollout_id: (item.staleness, item.stale) for rollout_id, item in by_id.items()} == {
        "old": (2, True), "newer": (1, False)}
    assert by_id["old"].weight_versions["source"] == "lines" and by_id["old"].weight_versions["start"] == "v1"
