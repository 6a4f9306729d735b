"""Reassembly of the project's own transcripts (docs/files.md): the shapes the recordings lack.

Every case runs whole, one byte at a time and at seeded random splits, and must give the same
result each time; where the official SDK can finish, our result also equals its accumulation.
"""

from __future__ import annotations

import dataclasses
import gzip
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capture import REASSEMBLERS, SSEParser, StreamTap

from tests import transcripts as t
from tests.sdk_oracle import SDK_ORACLES, VIEWS, SdkGaveUp


def chunkings(body: bytes, seed: int = 0) -> list[list[bytes]]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, 25)))
    per_event = [part + b"\n\n" for part in body.split(b"\n\n")[:-1]]  # As vLLM writes them (the tap's fast path).
    per_event += [body[len(b"".join(per_event)):]] if len(b"".join(per_event)) < len(body) else []
    return [[body], [body[i:i + 1] for i in range(len(body))], [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])],
            per_event]


def reassemble(dialect: str, pieces: list[bytes], encoding: str | None = None, status: int = 200):
    tap = StreamTap(dialect, encoding)
    terminal_hits = sum(tap.feed(piece) for piece in pieces)
    assert terminal_hits <= 1, "the terminal is reported once"
    return tap.finish(status)


def _same_raw_ending(outcome):
    """The raw text is every byte up to the chunk that completed the terminal event. With CRLF
    line ends a chunk may end between the blank line's CR (which already dispatches the event,
    WHATWG) and its LF, so that LF may or may not be in the raw text: compare without it."""
    raw = outcome.response_raw
    if raw and '"error"' in raw and raw.find("\n\n", raw.find('"error"')) >= 0:
        # A chat or completions error event is the terminal (the SDK stops there); what follows
        # it (`[DONE]`, or part of it) is in the raw text only when it arrived in the same chunk.
        raw = raw[:raw.find("\n\n", raw.find('"error"')) + 2]
    return dataclasses.replace(outcome, response_raw=raw[:-1] if raw and raw.endswith("\r\n") else raw)


def run_everywhere(dialect: str, body: bytes, encoding: str | None = None):
    """The outcome, after checking that every chunking agrees (and with the SDK where it finishes)."""
    outcomes = [_same_raw_ending(reassemble(dialect, pieces, encoding)) for pieces in chunkings(body, seed=len(body))]
    assert all(outcome == outcomes[0] for outcome in outcomes)
    if encoding is None and dialect in SDK_ORACLES:  # The SDKs accumulate no completions stream.
        sdk = SDK_ORACLES[dialect]([body])
        if not isinstance(sdk, SdkGaveUp):
            assert VIEWS[dialect](outcomes[0].response) == sdk
    return outcomes[0]


def test_vllm_chat_reasoning_field_and_usage_on_every_chunk():
    """`delta.reasoning` accumulates; usage comes from the last chunk that carries it; comments are skipped."""
    outcome = run_everywhere("chat", t.VLLM_CHAT_REASONING_USAGE_EVERY_CHUNK)
    message = outcome.response["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("Let me think.", "42")
    assert outcome.response["usage"]["completion_tokens"] == 3
    assert outcome.error_category is None and outcome.stream_truncated is False


def test_chat_n2_with_parallel_tool_calls_over_crlf():
    """Choices stay apart by index; two tool calls of one choice merge by their own index."""
    outcome = run_everywhere("chat", t.CHAT_N2_PARALLEL_TOOLS_CRLF)
    first, second = outcome.response["choices"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in first["message"]["tool_calls"]] == [
        ("call_a", "get_weather", '{"city": "Oslo"}'), ("call_b", "get_time", '{"tz": "CET"}')]
    assert (first["finish_reason"], second["finish_reason"]) == ("tool_calls", "stop")
    assert second["message"]["content"] == "Choice one."


def test_chat_cut_inside_tool_arguments_keeps_the_partial_call():
    outcome = run_everywhere("chat", t.CHAT_CUT_IN_TOOL_ARGUMENTS)
    call = outcome.response["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["arguments"] == '{"query": "long'
    assert (outcome.error_category, outcome.stream_truncated) == ("stream_truncated", True)


def test_unterminated_last_event_is_not_dispatched():
    """`data: [DONE]` without its blank line never happened (WHATWG): the stream is truncated."""
    outcome = run_everywhere("chat", t.CHAT_UNTERMINATED_LAST_EVENT)
    assert outcome.error_category == "stream_truncated"
    assert outcome.response["choices"][0]["message"]["content"] == "Hello \u2603"


def test_vllm_responses_stream_with_reasoning_text():
    outcome = run_everywhere("responses", t.VLLM_RESPONSES_STREAM)
    reasoning, message = outcome.response["output"]
    assert reasoning["content"][0]["text"] == "User greets; reply." and message["content"][0]["text"] == "Hi!"
    assert outcome.error_category is None


def test_responses_cut_inside_function_arguments_rebuilds_the_partial_response():
    outcome = run_everywhere("responses", t.RESPONSES_CUT_IN_FUNCTION_ARGUMENTS)
    (item,) = outcome.response["output"]
    assert (item["name"], item["arguments"]) == ("search", '{"query": "weath')
    assert outcome.response["id"] == "resp_vllm" and outcome.error_category == "stream_truncated"


def test_anthropic_overloaded_error_mid_stream():
    """`event: error` is an error terminal: category upstream_error, the text so far kept."""
    outcome = run_everywhere("messages", t.MESSAGES_OVERLOADED_MID_STREAM)
    assert outcome.error_category == "upstream_error" and outcome.stream_truncated is False
    assert outcome.response["content"] == [{"type": "text", "text": "Hello"}]
    assert outcome.response["error"]["type"] == "overloaded_error"


def test_messages_usage_is_the_latest_cumulative_value_not_a_sum():
    outcome = run_everywhere("messages", t.MESSAGES_STREAM)
    assert outcome.response["usage"] == {"input_tokens": 7, "cache_read_input_tokens": 3,
                                         "cache_creation_input_tokens": 0, "output_tokens": 2}


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_stream_is_decoded_for_the_tap(encoding):
    import zlib
    body = gzip.compress(t.CHAT_STREAM, mtime=0) if encoding == "gzip" else zlib.compress(t.CHAT_STREAM)
    outcome = run_everywhere("chat", body, encoding)
    assert outcome.response_raw == t.CHAT_STREAM.decode()
    assert outcome.response["choices"][0]["message"]["content"] == "Hello \u2603"


@pytest.mark.parametrize("encoding", ["compress", "zstd", "gzip"])
def test_an_unknown_or_corrupt_encoding_is_a_parse_error_not_an_exception(encoding):
    """``compress`` nobody decodes; these bytes are no zstd or gzip stream either."""
    outcome = reassemble("chat", [b"\x00\x01\x02"], encoding)
    assert outcome.error_category == "capture_parse_error" and outcome.parse_failure


TRANSCRIPTS = [("chat", t.CHAT_STREAM), ("chat", t.VLLM_CHAT_REASONING_USAGE_EVERY_CHUNK), ("chat", t.CHAT_N2_PARALLEL_TOOLS_CRLF),
               ("responses", t.RESPONSES_STREAM), ("responses", t.VLLM_RESPONSES_STREAM), ("messages", t.MESSAGES_STREAM),
               ("messages", t.MESSAGES_OVERLOADED_MID_STREAM)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(TRANSCRIPTS), st.lists(st.integers(min_value=1), max_size=30))
def test_any_split_of_any_transcript_gives_the_same_result(case, cut_seeds):
    dialect, body = case
    cuts = sorted({seed % len(body) for seed in cut_seeds} - {0})
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]
    assert _same_raw_ending(reassemble(dialect, pieces)) == _same_raw_ending(reassemble(dialect, [body]))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(REASSEMBLERS)), st.lists(st.binary(max_size=200), max_size=20))
def test_arbitrary_bytes_never_raise(dialect, pieces):
    """Garbage in, a category out: neither the parser nor a reassembler raises."""
    tap = StreamTap(dialect)
    for piece in pieces:
        tap.feed(piece)
    outcome = tap.finish(200)
    assert outcome.error_category in {"stream_truncated", "capture_parse_error", "upstream_error", "incomplete", None}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(REASSEMBLERS)),
       st.lists(st.dictionaries(st.sampled_from(["type", "index", "delta", "choices", "output_index", "item", "response",
                                                 "content_block", "message", "usage", "error", "part", "content_index"]),
                                st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=5),
                                             lambda children: st.lists(children, max_size=3) | st.dictionaries(
                                                 st.sampled_from(["type", "index", "text", "content", "tool_calls",
                                                                  "function", "arguments", "id"]), children, max_size=3),
                                             max_leaves=8), max_size=6), max_size=12),
       st.sampled_from(["message", "message_start", "content_block_start", "content_block_delta", "content_block_stop",
                        "message_delta", "response.output_item.added", "response.output_text.delta", "response.completed"]))
@pytest.mark.slow
def test_arbitrary_json_events_never_raise_in_a_reassembler(dialect, payloads, event_name):
    """Well-formed JSON of the wrong shape is tolerated by every reassembler."""
    import orjson

    from capture import ServerSentEvent
    reassembler = REASSEMBLERS[dialect]()
    for payload in payloads:
        reassembler.feed_event(ServerSentEvent(event=event_name, data=orjson.dumps(payload).decode()))
    reassembler.result()


def test_sse_parser_and_tap_are_exported():
    assert SSEParser().feed(b"data: x\n\n")[0].data == "x"


@pytest.mark.parametrize("dialect,body", TRANSCRIPTS)
def test_a_partial_result_taken_mid_stream_changes_nothing_after_it(dialect, body):
    """Text deltas are joined when a result is taken (not per delta: that is quadratic in a long
    stream); taking one after every event must not change the final result."""
    events = SSEParser().feed(body)
    checked = REASSEMBLERS[dialect]()
    for event in events:
        checked.feed_event(event)
        checked.result()
    reference = REASSEMBLERS[dialect]()
    for event in events:
        reference.feed_event(event)
    assert checked.result() == reference.result()


def test_long_text_deltas_join_to_the_whole_text():
    pieces = [f"t{i} " for i in range(20_000)]
    body = b"".join(b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"%s","reasoning":"%s"}}]}\n\n'
                    % (p.encode(), p.encode()) for p in pieces) + b"data: [DONE]\n\n"
    outcome = reassemble("chat", [body[:100], *event_chunks(body[100:])])
    message = outcome.response["choices"][0]["message"]
    assert message["content"] == message["reasoning"] == "".join(pieces)


def event_chunks(body: bytes) -> list[bytes]:
    return [part + b"\n\n" for part in body.split(b"\n\n")[:-1]]


def _event(name: str, payload: dict) -> bytes:
    import orjson
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


#: A Messages stream whose gateway updates the usage after the stop reason: a second
#: ``message_delta`` before ``message_stop`` (issue 72, point 6).
_UPDATED_AFTER_STOP = b"".join([
    _event("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}}),
    _event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    _event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
    _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
    _event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                             "usage": {"output_tokens": 5}}),
    _event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                             "usage": {"output_tokens": 7, "input_tokens": 12, "cache_read_input_tokens": 4}}),
    _event("message_stop", {"type": "message_stop"}),
])


def test_a_later_message_delta_counts_as_the_sdk_counts_it_when_it_comes_with_the_stop_reason():
    """Read whole (no end at the stop reason) the reply is the anthropic SDK's accumulation: the last
    usage counts. Ended at the first stop reason (through the sidecar, durable before the agent's end),
    a later ``message_delta`` in the same read still counts; one in a later read does not (the line
    is durable by then: docs/wire.md). Every split point, each rule."""
    sdk = SDK_ORACLES["messages"]([_UPDATED_AFTER_STOP])
    assert sdk["usage"] == {"input_tokens": 12, "output_tokens": 7, "cache_read_input_tokens": 4}
    assert VIEWS["messages"](reassemble("messages", [_UPDATED_AFTER_STOP]).response) == sdk
    first = _UPDATED_AFTER_STOP.index(b"event: message_delta")
    second = _UPDATED_AFTER_STOP.index(b"event: message_delta", first + 1)
    first_end = _UPDATED_AFTER_STOP.index(b"\n\n", first) + 2  # Where the first stop reason's event is whole.
    second_end = _UPDATED_AFTER_STOP.index(b"\n\n", second) + 2
    for cut in range(1, len(_UPDATED_AFTER_STOP)):
        tap = StreamTap("messages", expect={})  # Ends at the stop reason, as through the sidecar.
        ended = [tap.feed(_UPDATED_AFTER_STOP[:cut]), tap.feed(_UPDATED_AFTER_STOP[cut:])]
        usage = tap.finish(200).response["usage"]
        if first_end <= cut < second_end:  # The stop reason's read ends before the update is whole.
            assert ended == [True, False] and usage == {"input_tokens": 10, "output_tokens": 5}, cut
        else:
            assert usage == sdk["usage"], cut
