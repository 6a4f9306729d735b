"""Rollout ids, prefixed URLs and attaching captures to rollout records (docs/reading.md)."""

from __future__ import annotations

import copy

import pytest

from records import InvalidRolloutId, attach_model_call_capture, base_url_for_run, clear_model_call_captures, rollout_id_from_run
from records.contract import encode_capture_line
from records.contract.reading import resolve_model_base_url, url_path_for_request, url_path_for_run

RUN = {"_ng_task_index": 17, "_ng_rollout_index": 3, "responses_create_params": {"input": "hi"}}


@pytest.mark.parametrize("body,expected", [
    (RUN, "17-3"),
    ({**RUN, "_ng_attempt_index": 0}, "17-3"),
    ({**RUN, "_ng_attempt_index": 2}, "17-3-a2"),
    ({"_ng_rollout_id": "custom.id_1"}, "custom.id_1"),
    ({"_ng_rollout_id": "custom", "_ng_attempt_index": 1}, "custom-a1"),
    ({"_ng_task_index": 1}, None),
    ({"_ng_task_index": True, "_ng_rollout_index": 0}, "True-0"),  # Written as given, as Gym does.
    ({"_ng_task_index": "17", "_ng_rollout_index": "3", "_ng_attempt_index": "2"}, "17-3-a2"),
    ({**RUN, "_ng_attempt_index": True}, "17-3-a1"),
    ({**RUN, "_ng_attempt_index": False}, "17-3"),
    ({**RUN, "_ng_attempt_index": "0"}, "17-3"),
    ({**RUN, "_ng_attempt_index": 2.0}, "17-3-a2"),
    ({}, None),
])
def test_rollout_id_from_run(body, expected):
    assert rollout_id_from_run(body, observability_enabled=True) == expected


def test_explicit_rollout_id_is_validated_never_sanitised():
    with pytest.raises(InvalidRolloutId):
        rollout_id_from_run({"_ng_rollout_id": "../x"}, observability_enabled=True)


@pytest.mark.parametrize("attempt", ["two", "2.5", [1], {}])
def test_an_attempt_index_that_is_not_a_number_raises(attempt):
    """A retry must never silently share the first attempt's file (the suffix used to be dropped)."""
    with pytest.raises(ValueError, match="_ng_attempt_index"):
        rollout_id_from_run({**RUN, "_ng_attempt_index": attempt}, observability_enabled=True)


def test_indices_that_make_an_invalid_id_raise():
    with pytest.raises(ValueError, match="Invalid rollout id"):
        rollout_id_from_run({"_ng_task_index": "a/b", "_ng_rollout_index": 0}, observability_enabled=True)


def test_the_run_helpers_are_gated_where_the_seed_gates_them():
    assert rollout_id_from_run(RUN, observability_enabled=False) is None
    assert url_path_for_run("/v1/responses", RUN, observability_enabled=False) == "/v1/responses"
    assert base_url_for_run("http://m:8000/v1", RUN, observability_enabled=False) == "http://m:8000/v1"


def test_an_id_the_caller_already_has_is_carried_whatever_the_flag_says():
    """`url_path_for_request` and `resolve_model_base_url` are not gated (as NeMo Gym)."""
    for flag in (True, False, None):
        kwargs = {} if flag is None else {"observability_enabled": flag}
        assert url_path_for_request("/v1/chat/completions", "/ng-rollout/17-3/v1/responses",
                                    **kwargs) == "/ng-rollout/17-3/v1/chat/completions"
        assert resolve_model_base_url("policy", "17-3", {"policy": "http://m/v1"}, **kwargs) == "http://m/ng-rollout/17-3/v1"
    assert resolve_model_base_url("policy", None, {"policy": "http://m/v1"}) == "http://m/v1"


def test_urls_are_prefixed_when_on():
    assert url_path_for_run("/v1/responses", RUN, observability_enabled=True) == "/ng-rollout/17-3/v1/responses"
    assert base_url_for_run("http://m:8000/v1", RUN, observability_enabled=True) == "http://m:8000/ng-rollout/17-3/v1"
    assert base_url_for_run("http://m:8000", RUN, observability_enabled=True) == "http://m:8000/ng-rollout/17-3"
    assert url_path_for_request("/v1/chat/completions", "/ng-rollout/17-3/v1/responses",
                                observability_enabled=True) == "/ng-rollout/17-3/v1/chat/completions"
    assert url_path_for_request("/v1/responses", "/v1/responses", observability_enabled=True) == "/v1/responses"
    assert resolve_model_base_url("policy", "17-3-a1", {"policy": "http://m/v1"},
                                  observability_enabled=True) == "http://m/ng-rollout/17-3-a1/v1"
    with pytest.raises(KeyError, match="unknown model server"):
        resolve_model_base_url("judge", "1-1", {"policy": "http://m/v1"}, observability_enabled=True)


def test_attach_adds_only_its_key_and_omits_raw_payloads(tmp_path):
    response = {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1}}
    line = encode_capture_line({"model_call_id": "a", "dialect": "chat", "status_code": 200, "request": {"m": 1},
                                "response": response, "response_raw": "data: ..."})
    (tmp_path / "17-3.capture.jsonl").write_bytes(line + line.replace(b'"a"', b'"b"'))
    record = {**RUN, "reward": 1.0, "response": {"output": []}}
    before = copy.deepcopy(record)
    attached = attach_model_call_capture(record, str(tmp_path))
    assert record == before, "the input record is not changed"
    assert {k: v for k, v in attached.items() if k != "ng_model_call_capture"} == before
    capture = attached["ng_model_call_capture"]
    assert capture["rollout_id"] == "17-3" and capture["metrics"]["num_calls"] == 2 and "gaps" not in capture
    assert capture["metrics"]["tokens_in"] == 10
    for call in capture["calls"]:
        assert not {"request", "response", "request_raw", "response_raw"} & set(call)
        assert call["tokens_out"] == 1


def test_attach_reports_gaps(tmp_path):
    (tmp_path / "17-3.capture.jsonl").write_bytes(encode_capture_line({"model_call_id": "a"}) + b"garbage\n")
    (tmp_path / "17-3.capture.incomplete").write_bytes(b"")
    capture = attach_model_call_capture(RUN, str(tmp_path))["ng_model_call_capture"]
    assert capture["gaps"] == [{"code": "model_call_capture_records_unreadable", "detail": "count=1"},
                               {"code": "model_call_capture_incomplete"}]
    empty = attach_model_call_capture({**RUN, "_ng_rollout_index": 4}, str(tmp_path))["ng_model_call_capture"]
    assert empty["gaps"] == [{"code": "model_call_capture_no_records"}] and empty["calls"] == []
    (tmp_path / "17-5.capture.incomplete").write_bytes(b"")  # Marker only: incomplete, as Gym says.
    marker_only = attach_model_call_capture({**RUN, "_ng_rollout_index": 5}, str(tmp_path))["ng_model_call_capture"]
    assert marker_only["gaps"] == [{"code": "model_call_capture_incomplete"}]


def test_clear_before_dispatch_removes_exactly_those_attempts(tmp_path):
    for name in ("17-3.capture.jsonl", "17-3.capture.incomplete", "17-3-a1.capture.jsonl"):
        (tmp_path / name).write_bytes(b"")
    clear_model_call_captures(["17-3"], str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["17-3-a1.capture.jsonl"]


def test_gyms_entry_points_with_gyms_signatures(tmp_path):
    """merge_model_call_capture_into_record: several directories, in place; the first that holds
    the rollout answers. clear_model_call_captures_for_rollouts: run rows, every directory."""
    from records import clear_model_call_captures_for_rollouts, merge_model_call_capture_into_record
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    line = encode_capture_line({"model_call_id": "a", "dialect": "chat", "status_code": 200, "request": {"m": 1},
                                "response": {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]}})
    (second / "17-3.capture.jsonl").write_bytes(line)
    record = {**RUN, "reward": 0.5}
    assert merge_model_call_capture_into_record(record, [first, second]) is record
    capture = record["ng_model_call_capture"]
    assert capture["rollout_id"] == "17-3" and capture["metrics"]["num_calls"] == 1 and "gaps" not in capture
    assert "request" not in capture["calls"][0]
    with_payloads = merge_model_call_capture_into_record({**RUN}, [str(second)], include_payloads=True)
    assert with_payloads["ng_model_call_capture"]["calls"][0]["request"] == {"m": 1}
    assert merge_model_call_capture_into_record({"x": 1}, [first]) == {"x": 1}, "no rollout id: untouched"
    assert merge_model_call_capture_into_record({**RUN}, []) == RUN, "no directories: untouched"
    missing = merge_model_call_capture_into_record({**RUN, "_ng_rollout_index": 9}, [first, second])
    assert missing["ng_model_call_capture"]["gaps"] == [{"code": "model_call_capture_no_records"}]
    (first / "17-3-a1.capture.jsonl").write_bytes(line)
    clear_model_call_captures_for_rollouts([RUN, {**RUN, "_ng_attempt_index": "1"}, {"no": "ids"}], [first, second])
    assert list(first.iterdir()) == [] and list(second.iterdir()) == []


GYM_070_CALL_FIELDS = {"cache_creation_tokens", "cache_hit", "cached_tokens", "call_index", "client_session_id",
                       "completed_at", "dialect", "error_category", "finish_reason", "latency_total_ms", "latency_ttft_ms",
                       "local_response_reason", "model", "model_call_id", "model_ref", "reasoning_content", "response_id",
                       "response_source", "response_status", "started_at", "status_code", "tokens_in", "tokens_out",
                       "tokens_reasoning", "tokens_total", "tool_calls", "upstream_attempted", "upstream_status_code"}


def test_the_attachment_has_gyms_shape_unless_more_is_asked(tmp_path):
    """Issue 23: `merge_model_call_capture_into_record` attaches exactly NeMo Gym 0.7.0's keys (its
    calls without payloads, its seven metrics); ``extended=True`` adds ours in the same places."""
    from records import merge_model_call_capture_into_record
    (tmp_path / "17-3.capture.jsonl").write_bytes(encode_capture_line(
        {"model_call_id": "a", "dialect": "chat", "status_code": 200, "request": {"model": "m"},
         "response": {"object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 5}}, "stream_truncated": False}))
    gyms = merge_model_call_capture_into_record({**RUN}, [str(tmp_path)])["ng_model_call_capture"]
    assert set(gyms) == {"rollout_id", "metrics", "calls"}
    assert set(gyms["calls"][0]) == GYM_070_CALL_FIELDS
    assert list(gyms["metrics"]) == ["tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens",
                                     "latency_total_ms", "num_calls"]
    ours = merge_model_call_capture_into_record({**RUN}, [str(tmp_path)], extended=True)["ng_model_call_capture"]
    assert set(ours["calls"][0]) - GYM_070_CALL_FIELDS == {"client_agent_id", "client_parent_agent_id",
                                                          "client_assistant_message_id", "failure_report",
                                                          "model_operations", "stream_truncated", "token_counts",
                                                          "system_fingerprint", "engine", "engine_version", "engine_metrics",
                                                          "created_cache_tokens", "multimodal_tokens", "multimodal_tokens_by_modality",
                                                          "side_call"}
    assert {"num_errors", "error_categories", "num_tool_calls"} <= set(ours["metrics"])
    assert attach_model_call_capture(RUN, str(tmp_path))["ng_model_call_capture"] == gyms
