"""`CaptureStore` and reading records back (docs/files.md, docs/records.md)."""

from __future__ import annotations

import multiprocessing
import os

import orjson
import pytest

from records.contract.reading import append_capture_line
from records import CaptureStore, InvalidRolloutId, MalformedCaptureLine, aggregate_model_call_metrics, read_model_call_records
from records.contract import encode_capture_line


def _line(number: int, **fields) -> bytes:
    usage = {"prompt_tokens": 10, "completion_tokens": number, "prompt_tokens_details": {"cached_tokens": 4}}
    response = {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "h\u00e9llo \u2603"}, "finish_reason": "stop"}],
                "usage": usage}
    return encode_capture_line({"model_call_id": f"id{number}", "dialect": "chat", "status_code": 200,
                                "latency_ms": float(number), "response": response, **fields})


def _write(path, *lines: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(b"".join(lines))


def test_strict_and_tolerant_reads_of_a_torn_file(tmp_path):
    _write(tmp_path / "r.capture.jsonl", _line(1), b"{oops}\n", _line(2), b'{"model_call_id": "torn"')
    store = CaptureStore(tmp_path)
    with pytest.raises(MalformedCaptureLine):
        store.read("r")
    result = store.read_available("r")
    assert [line["model_call_id"] for line in result.lines] == ["id1", "id2"]
    assert result.call_indexes == [0, 2] and result.malformed_indexes == [1, 3] and result.torn_last_line
    records = read_model_call_records(store, "r")
    assert [r.call_index for r in records] == [0, 2]
    with pytest.raises(MalformedCaptureLine):
        read_model_call_records(store, "r", strict=True)


def test_blank_lines_are_skipped_and_unicode_survives(tmp_path):
    _write(tmp_path / "r.capture.jsonl", b"\n", _line(1), b"   \n", _line(2))
    store = CaptureStore(tmp_path)
    assert len(store.read("r")) == 2
    records = read_model_call_records(store, "r", strict=True)
    assert [r.call_index for r in records] == [0, 1]
    assert records[0].response["choices"][0]["message"]["content"] == "h\u00e9llo \u2603"


def test_missing_file_reads_as_no_calls(tmp_path):
    store = CaptureStore(tmp_path)
    assert store.read("nothing") == [] and read_model_call_records(store, "nothing") == []
    assert aggregate_model_call_metrics(store, "nothing")["num_calls"] == 0


def test_invalid_rollout_id_is_refused_by_the_store(tmp_path):
    with pytest.raises(InvalidRolloutId):
        CaptureStore(tmp_path).path_for("../etc/passwd")


def test_clear_touches_only_the_named_ids(tmp_path):
    store = CaptureStore(tmp_path)
    for rollout in ("a", "b", "a-a1"):
        _write(tmp_path / f"{rollout}.capture.jsonl", _line(1))
        store.mark_incomplete(rollout)
    (tmp_path / "unrelated.txt").write_text("keep")
    store.clear(["a", "missing"])
    assert sorted(os.listdir(tmp_path)) == ["a-a1.capture.incomplete", "a-a1.capture.jsonl", "b.capture.incomplete",
                                            "b.capture.jsonl", "unrelated.txt"]
    assert store.rollout_ids() == ["a-a1", "b"]


def test_aggregate_metrics_sum_reported_values_only(tmp_path):
    _write(tmp_path / "r.capture.jsonl", _line(1), _line(2),
           encode_capture_line({"model_call_id": "x", "status_code": 502, "error_category": "connection", "response": None}))
    gyms = aggregate_model_call_metrics(CaptureStore(tmp_path), "r")
    assert list(gyms) == ["tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens",
                          "latency_total_ms", "num_calls"], "NeMo Gym 0.7.0's keys, in its order, by default"
    metrics = aggregate_model_call_metrics(CaptureStore(tmp_path), "r", percentiles=(50, 99), extended=True)
    assert {k: metrics[k] for k in gyms} == gyms
    assert metrics["num_calls"] == 3 and metrics["tokens_in"] == 20 and metrics["tokens_out"] == 3
    assert metrics["cached_tokens"] == 8 and metrics["num_cache_hits"] == 2
    assert metrics["tokens_reasoning"] is None
    assert metrics["error_categories"] == {"connection": 1} and metrics["num_errors"] == 1
    assert (metrics["latency_ms_p50"], metrics["latency_ms_p99"]) == (1.0, 2.0)


def _append_many(args) -> None:
    path, worker = args
    for number in range(200):
        padding = "p" * (70_000 if number % 50 == 0 else 100)  # Some lines above 64 KiB.
        append_capture_line(path, encode_capture_line({"model_call_id": f"{worker}-{number}", "request": {"pad": padding}}))


def test_four_processes_appending_200_lines_each_read_back_intact(tmp_path):
    path = str(tmp_path / "shared.capture.jsonl")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_append_many, [(path, worker) for worker in range(4)])
    result = CaptureStore(tmp_path).read_available("shared")
    assert result.malformed == 0 and not result.torn_last_line
    ids = [line["model_call_id"] for line in result.lines]
    assert len(ids) == 800 and len(set(ids)) == 800
    assert result.call_indexes == list(range(800))


def test_lines_written_by_the_encoder_parse_back_identically(tmp_path):
    fields = {"model_call_id": "a", "request": {"k": [1, 2.5, None, "\u2603"]}, "extra_future_key": True}
    _write(tmp_path / "r.capture.jsonl", encode_capture_line(fields))
    (line,) = CaptureStore(tmp_path).read("r")
    assert line["request"] == fields["request"] and line["extra_future_key"] is True
    assert orjson.dumps(line["request"]) == orjson.dumps(fields["request"])


@pytest.mark.parametrize("content", [
    b'{"a": 1}\n{"b": 2}\n',
    b'{"a": 1}\r\n{"b": "\xc3\xa9"}\r\n',
    b'{"a": 1}\n[1]\n"text"\n{"b": 2}\n',  # Values that are not objects: malformed, indexes kept.
    b'{"a": 1}\n1, 2\n{"b": 2}\n',  # Two values on one line are not one line's object.
    b'{"a": 1}\n\n  \n{"b": 2}\n',  # Blank lines are not calls.
    b'{"a": 1}\n{"b": \n',  # A malformed line.
    b'{"a": 1}\n{"b": 2}',  # A torn last line.
    b"",
])
def test_whole_file_parse_reads_exactly_what_the_line_reader_reads(tmp_path, monkeypatch, content):
    """Blocks of lines are parsed as one JSON array when they can be (speed); never a different result."""
    from records.store import _store

    (tmp_path / "r.capture.jsonl").write_bytes(content)
    store = CaptureStore(tmp_path)
    fast = store.read_available("r")
    monkeypatch.setattr(_store, "_parse_as_one_array", lambda block: None)
    assert store.read_available("r") == fast, "line by line"
    monkeypatch.undo()
    monkeypatch.setattr(_store, "_BLOCK_BYTES", 9)  # Blocks of a line or two: bounds inside the file.
    assert store.read_available("r") == fast, "in small blocks"


def test_read_available_unpacks_as_gyms_pair(tmp_path):
    """NeMo Gym's `read_available_model_call_records(store, id)` unpacks `store.read_available`
    as ``(pairs, unreadable)``: ours does both (issue 23)."""
    _write(tmp_path / "r.capture.jsonl", _line(1))
    with open(tmp_path / "r.capture.jsonl", "ab") as handle:
        handle.write(b"garbage\n" + _line(2))
    result = CaptureStore(tmp_path).read_available("r")
    pairs, unreadable = result
    assert [index for index, _ in pairs] == [0, 2] and unreadable == 1
    assert [line for _, line in pairs] == result.lines and result.malformed == 1
