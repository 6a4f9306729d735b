"""Tool calls, reasoning, model operations and tool-request evidence across the three shapes (docs/records.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from records import (
    ModelCallRecord, ToolRequestEvidence, _tool_calls_and_reasoning, build_model_call_record, tool_request_evidence,
)

RESPONSES = {
    "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-x",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Plan A."}],
         "content": [{"type": "reasoning_text", "text": "Raw thought."}]},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "custom_tool_call", "id": "ct_1", "call_id": "call_2", "name": "run_python", "input": "print(1)"},
        {"type": "message", "id": "msg_1", "status": "completed", "content": [{"type": "output_text", "text": "Done."}]},
        "not an item",
    ],
    "usage": {"input_tokens": 10, "output_tokens": 5},
}
CHAT = {
    "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Let me check.", "reasoning": "Think first.",
        "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{not json"}}, 7]}}],
}
MESSAGES = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "stop_reason": "tool_use",
    "content": [{"type": "thinking", "thinking": "Hmm.", "signature": "s"},
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "x"}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                {"type": "text", "text": "Found it."},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"k": 1}}, None],
}


def test_responses_tool_calls_include_custom_tools_and_reasoning_text():
    calls, reasoning = _tool_calls_and_reasoning(RESPONSES)
    assert calls == [{"call_id": "call_1", "name": "get_weather", "arguments": {"city": "Oslo"}},
                     {"call_id": "call_2", "name": "run_python", "arguments": {"_raw": "print(1)"}}]
    assert reasoning == "Plan A.\nRaw thought."


def test_chat_tool_calls_keep_unparseable_arguments_raw_and_read_the_reasoning_alias():
    calls, reasoning = _tool_calls_and_reasoning(CHAT)
    assert calls == [{"call_id": "call_a", "name": "f", "arguments": {"_raw": "{not json"}}]
    assert reasoning == "Think first."


def test_messages_tool_use_and_thinking():
    calls, reasoning = _tool_calls_and_reasoning(MESSAGES)
    assert calls == [{"call_id": "toolu_1", "name": "lookup", "arguments": {"k": 1}}]
    assert reasoning == "Hmm."


# _as_arguments reads as NeMo Gym does: tests/records/store/test_gym_parity.py (issue 14).


@pytest.mark.parametrize("response", [
    {"object": "response", "output": "not a list"}, {"object": "response", "output": [{"type": "reasoning", "summary": "x"}]},
    {"choices": [None]}, {"choices": [{"message": "x"}]}, {"choices": [{"message": {"tool_calls": [{"function": 3}]}}]},
    {"type": "message", "content": [{"type": "tool_use", "input": "[["}]}, {"type": "message", "content": "text"},
    {}, {"choices": []},
])
def test_malformed_nested_shapes_never_raise(response):
    _tool_calls_and_reasoning(response)
    record = build_model_call_record({"response": response, "status_code": 200}, 0)
    assert isinstance(record, ModelCallRecord)


def test_model_operations_show_every_output_item_including_server_tools():
    record = build_model_call_record({"response": RESPONSES, "status_code": 200}, 0)
    assert [(op.kind, op.call_id, op.name) for op in record.model_operations] == [
        ("reasoning", None, None), ("server_tool_call", "ws_1", "web_search"), ("tool_call", "call_1", "get_weather"),
        ("tool_call", "call_2", "run_python"), ("text", None, None)]
    messages = build_model_call_record({"response": MESSAGES}, 0)
    assert [op.kind for op in messages.model_operations] == ["reasoning", "server_tool_call", "text", "tool_call"]
    chat = build_model_call_record({"response": CHAT}, 0)
    assert [op.kind for op in chat.model_operations] == ["reasoning", "text", "tool_call"]


def test_finish_reason_and_status_per_shape():
    assert build_model_call_record({"response": MESSAGES}, 0).finish_reason == "tool_use"
    assert build_model_call_record({"response": CHAT}, 0).finish_reason == "tool_calls"
    incomplete = {**RESPONSES, "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}}
    record = build_model_call_record({"response": incomplete}, 0)
    assert (record.finish_reason, record.response_status) == ("max_output_tokens", "incomplete")


@pytest.mark.parametrize("response,status_code,response_status,kind,ids", [
    (RESPONSES, 200, None, "available", {"call_1", "call_2"}),
    (CHAT, 200, None, "available", {"call_a"}),
    (MESSAGES, None, None, "available", {"toolu_1"}),
    (None, 200, None, "omitted", set()),
    ("not a dict", 200, None, "malformed", set()),
    ({"unknown": "shape"}, 200, None, "malformed", set()),
    ({"choices": [{"message": {"tool_calls": [{"function": {"name": "f"}}]}}]}, 200, None, "malformed", set()),
    (CHAT, 500, None, "unsuccessful", set()),
    (RESPONSES, 200, "failed", "unsuccessful", set()),
    ({**RESPONSES, "status": "cancelled"}, 200, None, "unsuccessful", set()),
])
def test_tool_request_evidence_kinds(response, status_code, response_status, kind, ids):
    evidence = tool_request_evidence(response, status_code, response_status)
    assert (evidence.kind, set(evidence.call_ids)) == (kind, ids)


def test_permits_link_answers():
    assert ToolRequestEvidence("available", frozenset({"a"})).permits_link("a") is True
    assert ToolRequestEvidence("available", frozenset({"a"})).permits_link("b") is False
    assert ToolRequestEvidence("omitted").permits_link("anything") is True
    assert ToolRequestEvidence("malformed").permits_link("a") is False
    assert ToolRequestEvidence("unsuccessful").permits_link("a") is False


def test_record_from_a_nemo_gym_core_keys_only_line():
    """A line with only the core keys builds a record; what it lacks is None, never 0."""
    line = {"model_call_id": "abc", "dialect": "chat", "model_ref": {"type": "responses_api_models", "name": "policy"},
            "started_at": 1.0, "completed_at": 2.0, "latency_ms": 1000.0, "latency_ttft_ms": None, "status_code": 200,
            "error_category": None, "request": {"model": "m", "messages": []}, "response": {**CHAT, "usage": None}}
    record = build_model_call_record(line, 3)
    assert (record.call_index, record.model_ref.name, record.latency_total_ms, record.model) == (3, "policy", 1000.0, "m")
    assert (record.tokens_in, record.tokens_out, record.cached_tokens, record.response_source) == (None, None, None, None)
    assert record.client_session_id is None and record.failure_report is None


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False, allow_infinity=False)
                     | st.text(max_size=6),
                     lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
                     max_leaves=10)
_LINE_KEYS = ["model_call_id", "dialect", "model_ref", "started_at", "completed_at", "latency_ms", "latency_ttft_ms",
              "status_code", "error_category", "request", "response", "client_session_id", "upstream_attempted",
              "response_source", "upstream_status_code", "local_response_reason", "request_raw", "response_raw",
              "stream_truncated", "failure"]
_RESPONSE_KEYS = ["object", "output", "choices", "type", "content", "usage", "model", "id", "status",
                  "incomplete_details", "stop_reason"]


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(_LINE_KEYS), _JSON, max_size=12),
       st.one_of(st.none(), st.dictionaries(st.sampled_from(_RESPONSE_KEYS), _JSON, max_size=6),
                 st.sampled_from([RESPONSES, CHAT, MESSAGES])))
@pytest.mark.slow
def test_any_line_builds_a_record_that_validates_as_declared(line, response):
    """Records are built without re-validation (speed); this proves every value has its declared type."""
    if response is not None:
        line = {**line, "response": response}
    record = build_model_call_record(line, 0)
    assert ModelCallRecord.model_validate(record.model_dump()) == record


def test_records_built_from_lines_behave_like_ordinary_pydantic_models():
    """`construct_checked` shares one fields set per model and shares call-id-free operations;
    none of that may show: every pydantic operation works and no record's change reaches another."""
    import copy
    import pickle

    first = build_model_call_record({"status_code": 200, "response": CHAT}, 0)
    second = build_model_call_record({"status_code": 200, "response": CHAT}, 1)
    assert first.model_fields_set == set(ModelCallRecord.model_fields)
    assert first.model_dump(exclude_unset=True) == first.model_dump()

    first.model = "changed"  # An ordinary assignment.
    assert first.model == "changed" and second.model != "changed"
    updated = first.model_copy(update={"call_index": 7})
    assert updated.call_index == 7 and first.call_index == 0
    for copied in (copy.copy(first), copy.deepcopy(first), pickle.loads(pickle.dumps(first))):
        assert copied == first
        copied.model_fields_set.discard("model")  # A copy owns its fields set.
        assert "model" in second.model_fields_set
    with pytest.raises(TypeError):
        first.model_fields_set.discard("model")  # The shared one refuses rather than leak.
    assert "model" in second.model_fields_set

    shared = [op for op in first.model_operations if op.call_id is None]
    assert shared and shared == [op for op in second.model_operations if op.call_id is None]
    with pytest.raises(ValueError):
        shared[0].kind = "refusal"  # Frozen: an observation cannot be edited under another record.
