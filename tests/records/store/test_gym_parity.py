"""`records` answers as NeMo Gym 0.7.0's reader does where the seed is silent (issue 14).

Each test names the point of the issue it shows. Where the seed states a rule (prompt_tokens
wins beside Anthropic cache fields; custom_tool_call; ...) the seed's rule is tested elsewhere
(test_records_tokens.py, test_records_shapes.py) and is not changed here.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import orjson
import pytest

from records import (
    CaptureStore, InvalidRolloutId, MalformedCaptureLine, ModelCallRecord, _as_arguments, _tool_calls_and_reasoning,
    build_model_call_record, extract_token_stats, read_model_call_records,
)


# 1. Token aliases -------------------------------------------------------------------------------

@pytest.mark.parametrize("usage,cached,reasoning", [
    ({"prompt_tokens": 10, "cached_input_tokens": 4, "reasoning_output_tokens": 2}, 4, 2),
    ({"input_tokens": 10, "input_tokens_details": {"cached_input_tokens": 3},
      "output_tokens_details": {"reasoning_output_tokens": 5}}, 3, 5),
    ({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 1, "cached_input_tokens": 9}}, 1, None),
    ({"prompt_tokens": 10}, None, None),
])
def test_cached_and_reasoning_aliases(usage, cached, reasoning):
    stats = extract_token_stats(usage)
    assert (stats["cached_tokens"], stats["tokens_reasoning"]) == (cached, reasoning)
    assert stats["cache_hit"] == (None if cached is None else cached > 0)


# 2. A fully cached Anthropic prompt ---------------------------------------------------------------

@pytest.mark.parametrize("usage,tokens_in", [
    ({"cache_read_input_tokens": 90, "cache_creation_input_tokens": 10, "output_tokens": 3}, 100),
    ({"cache_read_input_tokens": 0, "cache_creation_input_tokens": 0, "output_tokens": 3}, None),
    ({"input_tokens": 5, "cache_read_input_tokens": 90}, 95),
    ({"prompt_tokens": 7, "cache_read_input_tokens": 90}, 7),  # The seed's rule: prompt_tokens wins.
])
def test_cache_only_anthropic_usage(usage, tokens_in):
    assert extract_token_stats(usage)["tokens_in"] == tokens_in


# 3. Finish reason and status from partial replies ---------------------------------------------------

@pytest.mark.parametrize("response,finish,status", [
    ({"stop_reason": "max_tokens"}, "max_tokens", None),
    ({"incomplete_details": {"reason": "max_output_tokens"}}, "max_output_tokens", None),
    ({"status": "failed"}, None, "failed"),
    ({"status": "incomplete", "incomplete_details": {"reason": "content_filter"}}, "content_filter", "incomplete"),
    ({"choices": [{"finish_reason": "length"}], "status": "x"}, "length", "x"),
])
def test_partial_replies_still_say_why_they_ended(response, finish, status):
    record = build_model_call_record({"response": response}, 0)
    assert (record.finish_reason, record.response_status) == (finish, status)


# 4. _as_arguments exactly as Gym -------------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [
    ({"a": 1}, {"a": 1}),
    ('{"a": 1}', {"a": 1}),
    ("[1, 2]", [1, 2]),
    ("3", 3),
    ('"text"', "text"),
    ("", {"_raw": ""}),
    ("{not json", {"_raw": "{not json"}),
    (None, {}),
    (5, {}),
    ([1], {}),
    (b'{"a": 1}', {}),
])
def test_as_arguments_reads_as_gym(value, expected):
    assert _as_arguments(value) == expected


def test_as_arguments_takes_what_pythons_json_takes():
    assert json.dumps(_as_arguments('{"x": NaN}')) == '{"x": NaN}'


# 6. A record built by hand ---------------------------------------------------------------------------

def test_model_call_record_needs_only_its_index():
    record = ModelCallRecord(call_index=0)
    assert (record.client_session_id, record.client_assistant_message_id, record.tool_calls) == (None, None, [])


# 7. A status given as text --------------------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [("200", 200), (" 429 ", 429), (503.0, 503), (200, 200),
                                            ("2xx", None), (True, None), (None, None), ("", None)])
def test_status_code_as_text_is_read_as_an_int(value, expected):
    record = build_model_call_record({"status_code": value, "upstream_status_code": value}, 0)
    assert record.status_code == record.upstream_status_code == expected


# 8. Every chat choice ------------------------------------------------------------------------------

def test_tool_calls_and_reasoning_come_from_every_choice():
    def choice(index: int, call_id: str, reasoning: str) -> dict:
        return {"index": index, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "reasoning_content": reasoning,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "f", "arguments": f'{{"n": {index}}}'}}]}}
    response = {"object": "chat.completion", "choices": [choice(0, "c0", "first"), choice(1, "c1", "second")]}
    calls, reasoning = _tool_calls_and_reasoning(response)
    assert [(c["call_id"], c["arguments"]) for c in calls] == [("c0", {"n": 0}), ("c1", {"n": 1})]
    assert reasoning == "first\nsecond"
    record = build_model_call_record({"response": response}, 0)
    assert [op.call_id for op in record.model_operations if op.kind == "tool_call"] == ["c0", "c1"]
    assert record.finish_reason == "tool_calls"


def test_a_responses_function_call_without_call_id_is_known_by_its_item_id():
    response = {"object": "response", "output": [{"type": "function_call", "id": "fc_1", "name": "f", "arguments": "{}"}]}
    assert _tool_calls_and_reasoning(response)[0] == [{"call_id": "fc_1", "name": "f", "arguments": {}}]


# 11. CaptureStore's Gym surface ---------------------------------------------------------------------

def test_capture_store_paths_are_paths(tmp_path):
    store = CaptureStore(tmp_path)
    assert store.root == Path(tmp_path)
    assert store.path_for("r-1") == Path(tmp_path, "r-1.capture.jsonl")
    assert store.incomplete_path_for("r-1") == Path(tmp_path, "r-1.capture.incomplete")
    with pytest.raises(InvalidRolloutId, match=r"^Invalid rollout id"):
        store.path_for("../etc")
    missing = CaptureStore(tmp_path / "missing")  # Not created, unlike Gym's; and said so when read.
    with pytest.raises(FileNotFoundError, match="does not exist"):
        missing.read("x")
    assert not os.path.exists(tmp_path / "missing")


def test_a_malformed_line_is_also_an_orjson_decode_error(tmp_path):
    (tmp_path / "r.capture.jsonl").write_bytes(b'{"status_code": 200}\n{oops\n')
    store = CaptureStore(tmp_path)
    with pytest.raises(orjson.JSONDecodeError) as caught:
        store.read("r")
    error = caught.value
    assert isinstance(error, MalformedCaptureLine) and isinstance(error, json.JSONDecodeError)
    assert str(error).endswith(":2: not one JSON object ending in a newline") and error.line_number == 2
    copied = pickle.loads(pickle.dumps(error))
    assert (type(copied), str(copied)) == (MalformedCaptureLine, str(error))


def test_record_appends_under_the_file_contract(tmp_path):
    store = CaptureStore(tmp_path)
    store.record("r", {"response": {"stop_reason": "end_turn"}, "status_code": 200, "extra": Path("/x")})
    store.record("r", {"model_call_id": "b", "status_code": 500, "error_category": "upstream_error"})
    raw = (tmp_path / "r.capture.jsonl").read_bytes()
    assert raw.count(b"\n") == 2 and raw.endswith(b"\n")
    first = orjson.loads(raw.splitlines()[0])
    assert list(first)[:3] == ["model_call_id", "dialect", "model_ref"] and first["extra"] == "/x"
    records = read_model_call_records(store, "r", strict=True)
    assert [(r.call_index, r.status_code, r.finish_reason) for r in records] == [(0, 200, "end_turn"), (1, 500, None)]
    with pytest.raises(InvalidRolloutId):
        store.record("../r", {})


def latency_total(latencies: list) -> object:
    """`latency_total_ms` of a rollout whose calls took ``latencies``, through the public readers."""
    from records import aggregate_model_call_records, build_model_call_record
    records = [build_model_call_record({"latency_ms": latency}, index) for index, latency in enumerate(latencies)]
    return aggregate_model_call_records(records)["latency_total_ms"]


def test_sums_of_latencies_are_compensated_as_gyms_python_sums_them():
    """Gym 0.7.0 runs on Python 3.12+, whose ``sum`` of floats is compensated (Neumaier): records
    sums so on 3.10 and 3.11 too (the Gym tier compares it with Gym's interpreter on random lists)."""
    assert latency_total([0.1] * 10) == 1.0 and latency_total([1e100, 1.0, -1e100]) == 1.0
    assert latency_total([1, 2, 3]) == 6.0 and latency_total([1, 0.5]) == 1.5
