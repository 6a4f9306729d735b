"""The durable appender (docs/files.md): whole lines from many writers, never interleaved."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

from records.contract import create_incomplete_marker
from records.contract.reading import append_capture_line
from records import CaptureStore, MalformedCaptureLine
from records.contract import encode_capture_line


def test_concurrent_appends_of_large_lines_never_interleave(tmp_path):
    """16 threads append 200 lines, some above 64 KiB: every line is intact, none lost."""
    path = str(tmp_path / "r.capture.jsonl")

    def append(number: int) -> None:
        padding = "x" * (100_000 if number % 5 == 0 else 10)
        append_capture_line(path, encode_capture_line({"model_call_id": str(number), "request": {"p": padding}}))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(append, range(200)))
    result = CaptureStore(str(tmp_path)).read_available("r")
    assert result.malformed == 0 and not result.torn_last_line
    assert sorted(int(line["model_call_id"]) for line in result.lines) == list(range(200))


def test_encode_capture_line_orders_keys_and_keeps_unknown_ones_last():
    line = orjson.loads(encode_capture_line({"zeta": 1, "response_raw": "r", "dialect": "chat", "request": None}))
    assert list(line)[:3] == ["model_call_id", "dialect", "model_ref"]
    assert list(line)[-2:] == ["response_raw", "zeta"]


def test_tolerant_reader_skips_a_torn_last_line_and_strict_reader_raises(tmp_path):
    path = tmp_path / "r.capture.jsonl"
    path.write_bytes(b'{"a": 1}\n{"b": 2}\n{"c": ')
    store = CaptureStore(str(tmp_path))
    result = store.read_available("r")
    assert result.lines == [{"a": 1}, {"b": 2}]
    assert result.torn_last_line and result.malformed_indexes == [2]
    with pytest.raises(MalformedCaptureLine, match=":3:"):
        store.read("r")


def test_incomplete_marker_is_idempotent(tmp_path):
    marker = str(tmp_path / "r.capture.incomplete")
    create_incomplete_marker(marker)
    create_incomplete_marker(marker)
    assert os.path.getsize(marker) == 0 and CaptureStore(str(tmp_path)).is_incomplete("r")


def test_append_to_a_missing_directory_raises_oserror(tmp_path):
    with pytest.raises(OSError):
        append_capture_line(str(tmp_path / "gone" / "r.capture.jsonl"), b"{}\n")


def test_append_after_a_torn_line_keeps_the_new_line_intact(tmp_path):
    """A crash left a torn last line: the next append terminates it first, so both are readable apart."""
    path = tmp_path / "r.capture.jsonl"
    path.write_bytes(b'{"model_call_id": "ok"}\n{"model_call_id": "to')
    append_capture_line(str(path), encode_capture_line({"model_call_id": "after"}))
    result = CaptureStore(str(tmp_path)).read_available("r")
    assert [line["model_call_id"] for line in result.lines] == ["ok", "after"]
    assert result.malformed_indexes == [1] and not result.torn_last_line
