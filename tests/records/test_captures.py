"""`Captures(where)`: where the captures are, said once (docs/reading.md). It answers as the
readers do on every form of "where", fails at once on a wrong one, and ends and consumes rollouts
on a directory and on a store URL alike."""

from __future__ import annotations

import pathlib

import pytest

import records
from records import (
    Captures, CaptureStore, Consumer, StoreNotFound, aggregate_model_call_metrics, read_model_call_records, read_rollout_end,
    read_token_entries, read_token_records, trajectories,
)

from tests.capture_dirs import make_capture_dir, make_token_dir


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("captures")
    make_capture_dir(str(directory), rollouts=2, calls=3)
    make_token_dir(str(directory), rollouts=2, calls=3, tokens=4)
    return directory


@pytest.mark.parametrize("form", ["str", "Path", "CaptureStore", "Captures"])
def test_captures_answers_as_the_readers_do_on_every_form(run, form):
    where = {"str": str(run), "Path": run, "CaptureStore": CaptureStore(run), "Captures": Captures(run)}[form]
    captures = Captures(where)
    assert captures.rollout_ids() == CaptureStore(run).rollout_ids() and "rl-00000" in captures.rollout_ids()
    for rollout_id in ("rollout-0000", "rl-00001"):
        assert captures.calls(rollout_id) == read_model_call_records(str(run), rollout_id)
        assert captures.metrics(rollout_id, (50,), extended=True) == aggregate_model_call_metrics(
            str(run), rollout_id, (50,), extended=True)
        assert captures.tokens(rollout_id) == read_token_records(str(run), rollout_id)
        assert list(captures.iter_tokens(rollout_id)) == captures.tokens(rollout_id)
        assert captures.token_entries(rollout_id) == read_token_entries(str(run), rollout_id)
        assert captures.trajectories(rollout_id) == trajectories(str(run), rollout_id)
    assert [record.generation_token_ids for record in captures.tokens("rl-00001")], "the fixture's arrays were read"


def test_the_token_dir_is_said_once_too(tmp_path):
    capture_dir, token_dir = tmp_path / "calls", tmp_path / "tokens"
    make_token_dir(str(capture_dir), rollouts=1, calls=2, tokens=4)
    capture_dir.joinpath("rl-00000.capture.jsonl").rename(tmp_path / "moved")
    make_capture_dir(str(token_dir), rollouts=0, calls=0)
    (tmp_path / "moved").rename(capture_dir / "rl-00000.capture.jsonl")
    captures = Captures(capture_dir, token_dir=token_dir)
    assert captures.token_dir == str(token_dir)
    assert captures.tokens("rl-00000") == read_token_records(capture_dir, "rl-00000", str(token_dir))
    assert Captures(captures).token_dir == str(token_dir), "a Captures of a Captures keeps its token dir"


@pytest.mark.parametrize("wrong", [3, b"/tmp", None, {"dir": "/tmp"}])
def test_a_wrong_type_is_refused_at_once_in_one_sentence(wrong):
    with pytest.raises(TypeError) as raised:
        Captures(wrong)  # type: ignore[arg-type]  # The point: what a type checker would have caught.
    message = str(raised.value)
    assert message.startswith("Captures takes where the captures are") and type(wrong).__name__ in message
    assert "\n" not in message


def test_a_directory_that_is_not_there_is_refused_at_once_a_store_when_read(tmp_path, monkeypatch):
    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(StoreNotFound, match="no capture directory at"):
        Captures(tmp_path / "no-such-dir")
    assert not (tmp_path / "no-such-dir").exists(), "nothing is created by looking"
    early = Captures(f"segments://{tmp_path / 'no-such-store'}")  # A trainer may start before any upload ...
    assert early.consumer("trainer").take(1) == []
    with pytest.raises(StoreNotFound, match="no capture store there"):  # ... but reading calls says what is wrong.
        early.rollout_ids()


@pytest.mark.parametrize("layout", ["directory", "segments"])
def test_ends_and_the_consumer_on_a_directory_and_a_store_url(tmp_path, monkeypatch, layout):
    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    if layout == "directory":
        make_capture_dir(str(tmp_path / "run"), rollouts=2, calls=1)
        where = str(tmp_path / "run")
    else:
        where = f"segments://{tmp_path / 'store'}"
    captures = Captures(where)
    assert captures.ended("rollout-0000") is None
    # (On the store, a rollout that made no call: said so.)
    end = captures.end("rollout-0000", outcome={"reward": 1.0}, allow_empty=layout != "directory")
    assert captures.ended("rollout-0000") == end == read_rollout_end(where, "rollout-0000")
    assert end.outcome == {"reward": 1.0}
    consumer = captures.consumer("trainer", lease_seconds=60)
    assert isinstance(consumer, Consumer)
    taken = consumer.take(8)
    assert "rollout-0000" in [rollout.rollout_id for rollout in taken]
    consumer.ack(taken, step=1)
    assert Consumer(where, "trainer").take(8) == [], "one consumer state, whichever door opened it"


def test_the_readers_door_puts_gym_names_first_and_stays_small():
    gym = ["ModelCallRecord", "ToolRequestEvidence", "_as_arguments", "_cache_signal", "_prompt_size", "_token_count",
           "_tool_calls_and_reasoning", "_usage_detail_token", "aggregate_model_call_records", "build_model_call_record",
           "extract_token_stats", "tool_request_evidence"]
    assert records.__all__[:len(gym)] == gym
    assert len(records.__all__) <= 52  # 50, and the run's end and an end's refusal (issue 71)
    assert {"Captures", "Consumer", "trajectories", "read_token_records", "end_rollout"} <= set(records.__all__)
