"""The hand-off at a long run's scale (docs/reading.md, "At a long run's scale"): ends are found from
the end index from a checkpoint's cursor on, never by listing the run; a restart starts from the
newest checkpoint and reads nothing before its cursor; an index entry whose end never came or is
another stands for nothing; a listing with a start-after returns exactly what sorts after, on a
path and on a real S3 server. (What it costs, from 1,000 to 1,000,000 rollouts: `make bench`,
benchmarks/bench_scale.py.)"""

from __future__ import annotations

import glob
import os
import time

import pytest

from records import CaptureStore, Consumer, end_rollout
from records.contract import END_INDEX, ObjectStore, START_INDEX, add_to_index, index_entries_after
from records.contract.writing import index_name
from tests.records.training.test_handoff_store import s3_server  # noqa: F401  (the fixture)

#: The index's lag in these tests: ends are written well after it (the default is 60 s, for clock skew).
LAG = 0.2


def _rollout(directory: str, rollout_id: str, reward: float = 1.0) -> None:
    CaptureStore(directory).record(rollout_id, {"model_call_id": "a" * 32, "dialect": "chat", "status_code": 200})
    end_rollout(directory, rollout_id, {"reward": reward})


def _consumed(directory: str, ids: list[str], step: int = 1) -> Consumer:
    consumer = Consumer(directory, "trainer", index_lag_seconds=LAG)
    taken = consumer.take(len(ids))
    assert sorted(item.rollout_id for item in taken) == sorted(ids)
    consumer.ack(taken, step=step)
    time.sleep(2 * LAG)  # The cursor passes them once their entries are older than the lag.
    consumer.take(1)  # (A listing after that.)
    consumer.commit(step)
    return consumer


def test_a_restart_reads_nothing_before_its_checkpoint(tmp_path):
    directory = str(tmp_path)
    history = [f"old{n}" for n in range(40)]
    for rollout_id in history:
        _rollout(directory, rollout_id)
    _consumed(directory, history)
    # The history's ends and their entries are gone: what a restart knows of them is the checkpoint's.
    for rollout_id in history:
        os.unlink(os.path.join(directory, f"{rollout_id}.end.json"))
    for entry in glob.glob(os.path.join(directory, END_INDEX, "*", "*")):
        os.unlink(entry)
    for rollout_id in ("new0", "new1", "new2"):
        _rollout(directory, rollout_id)
    restarted = Consumer(directory, "trainer", index_lag_seconds=LAG)
    restarted.rewind(1)
    taken = restarted.take(10)
    assert sorted(item.rollout_id for item in taken) == ["new0", "new1", "new2"]
    counts = restarted.counts()
    assert (counts["final"], counts["leased"], counts["waiting"]) == (40, 3, 0)
    restarted.ack(taken)
    assert restarted.counts()["final"] == 43


def test_acks_pending_at_a_checkpoint_are_undone_by_a_rewind_after_it(tmp_path):
    directory = str(tmp_path)
    for rollout_id in ("a0", "a1"):
        _rollout(directory, rollout_id)
    trainer = Consumer(directory, "trainer", index_lag_seconds=LAG)
    first, second = trainer.take(1), trainer.take(1)
    trainer.ack(first, step=1)
    trainer.ack(second, step=2)
    time.sleep(2 * LAG)
    trainer.take(1)
    trainer.commit(1)  # A checkpoint past both ends: a1's ack at step 2 is open in it.
    restarted = Consumer(directory, "trainer", index_lag_seconds=LAG)
    assert restarted.counts()["final"] == 1 and restarted.counts()["pending"] == 1
    restarted.rewind(1)  # The trainer's checkpoint at step 1: step 2's ack is undone.
    again = restarted.take(5)
    assert [item.rollout_id for item in again] == [second[0].rollout_id]
    restarted.ack(again, step=2)
    restarted.commit(2)
    assert Consumer(directory, "trainer", index_lag_seconds=LAG).counts()["final"] == 2


def test_an_index_entry_without_its_end_stands_for_nothing(tmp_path):
    directory = str(tmp_path)
    CaptureStore(directory).record("real", {"model_call_id": "a" * 32, "dialect": "chat", "status_code": 200})
    # A writer that died between the entry and the end (unanswered), and one that lost a race (another stamp).
    add_to_index(directory, END_INDEX, time.time() - 1000, "never")
    add_to_index(directory, END_INDEX, time.time() - 1000, "real")
    end_rollout(directory, "real", {"reward": 0.5})
    trainer = Consumer(directory, "trainer", index_lag_seconds=LAG)
    taken = trainer.take(10)
    assert [(item.rollout_id, item.outcome) for item in taken] == [("real", {"reward": 0.5})]
    assert trainer.counts()["leased"] == 1 and trainer.counts()["waiting"] == 0


def test_a_rollout_started_before_a_checkpoint_without_an_end_is_still_unended_after_a_restart(tmp_path):
    directory = str(tmp_path)
    CaptureStore(directory).record("crashed-0", {"model_call_id": "a" * 32, "dialect": "chat", "status_code": 200})
    _rollout(directory, "crashed-1")
    trainer = _consumed(directory, ["crashed-1"])
    assert trainer.unended_seconds == 300.0
    restarted = Consumer(directory, "trainer", index_lag_seconds=LAG, unended_seconds=0.0)
    assert restarted.unended() == {"crashed": ["crashed-0"]}
    end_rollout(directory, "crashed-0")
    assert Consumer(directory, "trainer", index_lag_seconds=LAG, unended_seconds=0.0).unended() == {}


def _names_after_cases(store: ObjectStore) -> None:
    stamps = [1_700_000_000.0 + offset for offset in (0.0, 0.5, 59.9, 60.0, 61.0, 3600.0)]
    for number, stamp in enumerate(stamps):
        store.put(index_name(END_INDEX, stamp, f"r{number}"), b"")
    store.put(index_name(START_INDEX, stamps[0], "other"), b"")
    for cut in range(len(stamps)):
        found = index_entries_after(store, END_INDEX, stamps[cut])
        assert found == [(stamp, f"r{number}") for number, stamp in enumerate(stamps) if number >= cut], cut
    assert index_entries_after(store, END_INDEX, stamps[-1] + 1) == []


def test_a_listing_from_a_point_on_a_path(tmp_path):
    _names_after_cases(ObjectStore(f"segments://{tmp_path}/store"))


@pytest.mark.slow
def test_a_listing_from_a_point_on_s3(s3_server):  # noqa: F811
    _names_after_cases(ObjectStore("s3://captures/names-after"))
