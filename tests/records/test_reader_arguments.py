"""One reader API (issue 47): every reader takes a directory path (str or PathLike) or a
`CaptureStore`, and gives the same answer for each; anything else is refused in one sentence."""

from __future__ import annotations

import pathlib

import pytest

from records import (
    Captures, CaptureStore, aggregate_model_call_metrics, attach_model_call_capture, clear_model_call_captures,
    merge_model_call_capture_into_record, read_model_call_records, read_token_entries, read_token_records, trajectories,
)
from records.training import capture_files, rollout_rows_of
from records.store import late_entries

from tests.capture_dirs import make_capture_dir, make_token_dir


def _forms(directory: pathlib.Path) -> dict[str, object]:
    return {"str": str(directory), "Path": directory, "CaptureStore": CaptureStore(directory), "Captures": Captures(directory)}


READERS = {
    "read_model_call_records": lambda where: [r.model_call_id for r in read_model_call_records(where, "rollout-0000")],
    "aggregate_model_call_metrics": lambda where: aggregate_model_call_metrics(where, "rollout-0000"),
    "read_token_records": lambda where: [(r.model_call_id, r.generation_token_ids) for r in read_token_records(where, "rl-00000")],
    "read_token_entries": lambda where: read_token_entries(where, "rl-00000"),
    "late_entries": lambda where: late_entries(where, "rl-00000"),
    "trajectories": lambda where: trajectories(where, "rl-00000").mask_reason,
    "rollout_rows_of": lambda where: len(rollout_rows_of(where, "rollout-0000", "calls")),
    "capture_files": lambda where: [size for _, size in capture_files(where)],
    "attach_model_call_capture": lambda where: attach_model_call_capture({"_ng_rollout_id": "rollout-0000"}, where),
    "merge_model_call_capture_into_record": lambda where: merge_model_call_capture_into_record(
        {"_ng_task_index": 0, "_ng_rollout_index": 0}, [where]),
}


#: The fixture has no token files (its arrays are on the lines): these find nothing in each form.
NOTHING_IN_THE_FIXTURE = {"read_token_entries", "late_entries"}


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("captures")
    make_capture_dir(str(directory), rollouts=2, calls=3)
    make_token_dir(str(directory), rollouts=1, calls=2, tokens=4)
    return directory


@pytest.mark.parametrize("reader", READERS)
def test_every_reader_takes_a_path_a_pathlike_or_a_store_alike(captures, reader):
    answers = {form: READERS[reader](where) for form, where in _forms(captures).items()}
    assert answers["str"] == answers["Path"] == answers["CaptureStore"] == answers["Captures"], answers
    if reader not in NOTHING_IN_THE_FIXTURE:
        assert answers["str"] not in (None, [], 0, {}), "the fixture's captures were found"


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("wrong", [3, b"/tmp", None, {"dir": "/tmp"}])
def test_a_wrong_type_is_refused_in_one_sentence_naming_what_is_taken(reader, wrong):
    with pytest.raises(TypeError) as raised:
        READERS[reader](wrong)
    message = str(raised.value)
    assert "takes a capture directory" in message and "CaptureStore" in message and type(wrong).__name__ in message
    assert "\n" not in message


def test_clearing_takes_any_form_and_the_store_itself_refuses_a_wrong_type(tmp_path):
    for form, where in _forms(tmp_path).items():
        make_capture_dir(str(tmp_path), rollouts=1, calls=1)
        clear_model_call_captures(["rollout-0000"], where)
        assert read_model_call_records(tmp_path, "rollout-0000") == [], form
    with pytest.raises(TypeError, match="CaptureStore takes a capture directory"):
        CaptureStore(42)  # type: ignore[arg-type]
