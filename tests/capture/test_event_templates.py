"""The tap's event templates (issue 34) change nothing but the speed: differential tests.

A stream is generated from a model of vLLM's chat chunks (text, held-back tokens' empty deltas,
logprob entries, token ids, several tokens a chunk), then spoilt the ways real bytes go wrong
between one event and the next (escapes and quotes in a text, control characters, bad UTF-8, half
a character in each of two events, a number orjson would write otherwise, an id too long for an
int, spaces, an event that is another shape, ``[TOOL_CALLS]``). The same bytes, whole, one event a
read and at random splits, go through a tap that learns templates and one that does not: the
capture (the line's response, category, failure), the counters, the SSE framing's count and, with
the token capture mode's cutter, every byte the client gets must be the same.
"""

from __future__ import annotations

import random

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capture import AddedFieldCutter, CuttingStreamTap, StreamTap, token_fields_to_add
from capture._event_templates import INTS, LEARN_AFTER_LINES, NUMBER, TEXT, learn_template

from tests.capture_outcomes import outcome_with_cut_entries

HEAD = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1796084163, "model": "m"}
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}

#: Texts a token may have: mostly plain or non-ASCII, one in 24 with what a template must not take
#: (a quote, a backslash, a control character) or the Mistral marker (runs of vLLM's 5-slot chunk
#: are taken from 20 events on: they must come up).
TEXTS = st.tuples(st.integers(0, 23), st.sampled_from([" the", "lo", "", " é", "日本", " a", "x\x7f", "\u2028"]),
                  st.sampled_from(["\"", "a\\b", "\n", "\t", "[TOOL_CALLS]"])).map(lambda drawn: drawn[2] if drawn[0] == 0 else drawn[1])


@st.composite
def chat_stream(draw: st.DrawFn) -> list[bytes]:
    """One vLLM-shaped chat stream's event data, spoilt here and there."""
    logprobs = draw(st.booleans())
    token_ids = draw(st.booleans())
    key = draw(st.sampled_from(["content", "reasoning_content"]))
    events = [orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}],
                            "prompt_token_ids": [1, 2] if token_ids else None})]
    for position in range(draw(st.integers(1, 120))):
        per_chunk = draw(st.sampled_from([1] * 7 + [2]))
        texts = [draw(TEXTS) for _ in range(per_chunk)]
        held_back = draw(st.integers(0, 14)) == 0
        choice: dict = {"index": 0, "delta": {} if held_back else {key: "".join(texts)},
                        "logprobs": {"content": [{"token": text, "logprob": -0.25 - position / 8 - number / 16,
                                                  "bytes": list(text.encode()), "top_logprobs": []}
                                                 for number, text in enumerate(texts)]} if logprobs else None,
                        "finish_reason": None}
        if token_ids:
            choice["token_ids"] = [1000 + position * 2 + number for number in range(per_chunk)]
        events.append(orjson.dumps({**HEAD, "choices": [choice]}))
        spoil = draw(st.integers(0, 60))
        if spoil == 1:  # Half a character in this event's text, the other half in the next event's.
            events[-1] = events[-1].replace(b'":"', b'":"\xe2\x82', 1) if b'"content":"' in events[-1] else events[-1]
            events.append(orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {"content": "\u00ac"[:0] + "z"},
                                                             "logprobs": None, "finish_reason": None}]}).replace(b'"z"', b'"\xacz"'))
        elif spoil == 2:
            events[-1] = events[-1].replace(b"-0.", b"-00.", 1)  # Not JSON.
        elif spoil == 3:
            events[-1] = events[-1].replace(b"5,", b"50,", 1).replace(b"25", b"250", 1)  # A number orjson writes otherwise.
        elif spoil == 4 and token_ids:
            events[-1] = events[-1].replace(b'"token_ids":[', b'"token_ids":[123456789012345678901,', 1)
        elif spoil == 5:
            events[-1] = events[-1].replace(b'"index":0', b'"index": 0', 1)  # Another writer's spacing.
        elif spoil == 6:
            events[-1] = events[-1][:-2]  # Cut short.
        elif spoil == 7:
            events[-1] = events[-1].replace(b'"finish_reason":null', b'"finish_reason":null,"extra":1', 1)
        elif spoil == 8 and b'"content":"' in events[-1]:
            events[-1] = events[-1].replace(b'"content":"', b'"content":"\x01', 1)  # A raw control character.
        elif spoil == 9 and logprobs:
            events[-1] = events[-1].replace(b'"logprob":-', b'"logprob":-1e999', 1).replace(b"-1e9990.", b"-1e999", 1)
        elif spoil == 10 and b'"content":"' in events[-1]:
            events[-1] = events[-1].replace(b'"content":"', b'"content":"\xff', 1)  # Not UTF-8.
    last = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    if token_ids:
        last["token_ids"] = []
    events.append(orjson.dumps({**HEAD, "choices": [last]}))
    events.append(orjson.dumps({**HEAD, "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 9, "total_tokens": 11}}))
    events.append(b"[DONE]")
    return events


def _pieces(body: bytes, events: list[bytes], seed: int) -> dict[str, list[bytes]]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, 12)))
    one_a_read = [b"data: " + event + b"\n\n" for event in events]
    halves = [one_a_read[at:at + 5] for at in range(0, len(one_a_read), 5)]
    return {"whole": [body], "one event a read": one_a_read, "five a read": [b"".join(group) for group in halves],
            "random": [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]}


def _tap_through(pieces: list[bytes], templates: bool, cut: bool, request: dict) -> tuple[StreamTap, bytes, int]:
    cutter = AddedFieldCutter("chat", token_fields_to_add("chat", request), request) if cut else None
    tap = (CuttingStreamTap("chat", cutter=cutter, templates=templates, learn_after=0) if cutter is not None
           else StreamTap("chat", templates=templates, learn_after=0))
    out, terminal_at = [], -1
    for position, piece in enumerate(pieces):
        if tap.feed(piece) and terminal_at < 0:
            terminal_at = position
        out.append(tap.take_output() if isinstance(tap, CuttingStreamTap) else b"")  # An observer gives nothing back.
    return tap, b"".join(out) + (tap.close_output() if isinstance(tap, CuttingStreamTap) else b""), terminal_at


def _same(pieces: list[bytes], cut: bool, request: dict) -> int:
    """Asserts the two taps agree on everything; the events the template tap took in runs."""
    fast, fast_out, fast_terminal = _tap_through(pieces, True, cut, request)
    slow, slow_out, slow_terminal = _tap_through(pieces, False, cut, request)
    assert fast_terminal == slow_terminal
    assert fast.has_content == slow.has_content
    assert fast._parser.field_lines == slow._parser.field_lines
    assert fast.generated_so_far() == slow.generated_so_far()
    assert fast.collected_arrays() == slow.collected_arrays()
    if cut:
        assert fast_out == slow_out
        for counter in ("cut_values", "dropped_events", "uncut_events"):
            assert getattr(fast.cutter, counter) == getattr(slow.cutter, counter), counter
    assert fast.finish(200) == slow.finish(200)
    return len(fast._templates or ())


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_stream(), st.booleans(), st.sampled_from([{}, {"logprobs": True}, {"return_token_ids": True}]))
def test_a_tap_with_templates_captures_and_cuts_what_one_without_does(events, cut, asked):
    body = b"".join(b"data: " + event + b"\n\n" for event in events)
    for pieces in _pieces(body, events, seed=len(body)).values():
        _same(pieces, cut, {**REQUEST, **asked})


def test_templates_take_the_runs_of_a_clean_stream():
    """The fast path is taken (a test that the differential one is not comparing two slow paths)."""
    events = [orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}]})]
    events += [orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "logprobs": {"content": [
        {"token": f" t{i}", "logprob": -0.5, "bytes": [32, 116], "top_logprobs": []}]}, "finish_reason": None,
        "token_ids": [i]}]}) for i in range(50)]
    events += [orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]}), b"[DONE]"]
    body = b"".join(b"data: " + event + b"\n\n" for event in events)
    for cut in (False, True):
        for pieces in ([body], [b"data: " + event + b"\n\n" for event in events]):
            cutter = AddedFieldCutter("chat", token_fields_to_add("chat", REQUEST), REQUEST) if cut else None
            tap = CuttingStreamTap("chat", cutter=cutter, learn_after=0) if cutter is not None else StreamTap("chat", learn_after=0)
            assert sum(tap.feed(piece) for piece in pieces) == 1
            assert tap.templated_events == (49 if len(pieces) == 1 else 0), "taken in runs from one read"
            assert outcome_with_cut_entries(tap).response["choices"][0]["message"]["content"] == "".join(
                f" t{i}" for i in range(50))
            _same(pieces, cut, REQUEST)


def test_templates_are_learnt_only_once_a_stream_is_long():
    """A short reply is folded the general way (learning costs more than it saves there); from
    `LEARN_AFTER_LINES` lines on, reads of whole events are taken in runs, with the same outcome."""
    events = [orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}]})]
    events += [orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "logprobs": None,
                                                  "finish_reason": None}]}) for i in range(2 * LEARN_AFTER_LINES)]
    events += [orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]}), b"[DONE]"]
    parts = [b"data: " + event + b"\n\n" for event in events]
    short = b"".join(parts[:LEARN_AFTER_LINES])
    tap, general = StreamTap("chat"), StreamTap("chat", templates=False)
    assert not tap.feed(short) and not general.feed(short)
    assert tap.templated_events == 0, "a reply this short is not worth a template"
    rest = b"".join(parts[LEARN_AFTER_LINES:])
    assert tap.feed(rest) and general.feed(rest)
    assert tap.templated_events > LEARN_AFTER_LINES // 2
    assert tap.finish(200) == general.finish(200)
    assert tap.finish(200).response["choices"][0]["message"]["content"] == "".join(f" t{i}" for i in range(2 * LEARN_AFTER_LINES))


@pytest.mark.parametrize("spoilt, written", [(b'"logprob":-0.5,', b'"logprob":-0.5,7,'), (b'"bytes":[32,116]', b'"bytes":[32,116,[1]]'),
                                               (b'"bytes":[32,116]', b'"bytes":[32,null]'), (b'"token_ids":[7]', b'"token_ids":[-0]'),
                                               (b'"token_ids":[7]', b'"token_ids":[123456789012345678901]'),
                                               (b'"logprob":-0.5,', b'"logprob":-5e-1,')])
def test_a_value_that_is_not_one_of_its_kind_ends_the_run(spoilt, written):
    """A slot's value in a run that is not one value of the slot's kind as orjson writes it (two
    numbers, a list in a list, null, -0, an int too long, another way to write a number) is not
    taken by the template: that event goes the general way, whose outcome is the reference."""
    events = [orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "logprobs": None, "finish_reason": None}]})]
    events += [orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {"content": " t"}, "logprobs": {"content": [
        {"token": " t", "logprob": -0.5, "bytes": [32, 116], "top_logprobs": []}]}, "finish_reason": None,
        "token_ids": [7]}]}) for i in range(60)]
    assert spoilt in events[30]
    events[30] = events[30].replace(spoilt, written)
    events += [orjson.dumps({**HEAD, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]}), b"[DONE]"]
    body = b"".join(b"data: " + event + b"\n\n" for event in events)
    for cut in (False, True):
        assert _same([body], cut, {**REQUEST, "logprobs": True, "return_token_ids": True}) == 1


@pytest.mark.parametrize("kind, value, written", [(TEXT, "é x", "é x".encode()), (NUMBER, -0.5, b"-0.5"), (INTS, [1, 22], b"1,22")])
def test_a_template_is_learnt_only_from_compact_json(kind, value, written):
    payload = {"a": 1, "v": value, "z": None}
    data = orjson.dumps(payload)
    learnt = learn_template(b"data: ", data, payload, [("v", ("v",), kind)])
    assert learnt is not None
    template = learnt[0]
    columns: list[list[bytes]] = [[]]
    assert template.take([b"data: " + data], 0, columns) == 1 and columns == [[written]]
    spaced = data.replace(b'"a":1', b'"a": 1')
    assert learn_template(b"data: ", spaced, payload, [("v", ("v",), kind)]) is None


def _named(name: str, payload: dict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


@st.composite
def messages_stream(draw: st.DrawFn) -> bytes:
    """An Anthropic Messages stream: text, thinking (with its signature), a tool's input JSON and
    pings, each delta's text sometimes one a template must not take."""
    events = [_named("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 3, "output_tokens": 1}}})]
    kinds = draw(st.lists(st.sampled_from(["text", "thinking", "tool_use"]), min_size=1, max_size=3))
    for index, kind in enumerate(kinds):
        block = {"text": {"type": "text", "text": ""}, "thinking": {"type": "thinking", "thinking": ""},
                 "tool_use": {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {}}}[kind]
        events.append(_named("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
        for _ in range(draw(st.integers(0, 30))):
            piece = draw(TEXTS)
            delta = {"text": {"type": "text_delta", "text": piece}, "thinking": {"type": "thinking_delta", "thinking": piece},
                     "tool_use": {"type": "input_json_delta", "partial_json": piece}}[kind]
            events.append(_named("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
            if draw(st.integers(0, 19)) == 0:
                events.append(_named("ping", {"type": "ping"}))
            if draw(st.integers(0, 29)) == 0:
                events[-1] = events[-1].replace(b'"index":', b'"index": ', 1)
        if kind == "thinking":
            events.append(_named("content_block_delta", {"type": "content_block_delta", "index": index,
                                                          "delta": {"type": "signature_delta", "signature": "c2ln"}}))
        events.append(_named("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(_named("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}}))
    events.append(_named("message_stop", {"type": "message_stop"}))
    return b"".join(events)


@st.composite
def responses_stream(draw: st.DrawFn) -> bytes:
    """An OpenAI Responses stream: a reasoning item and a message, or a function call, with
    numbered deltas (a number out of order, a number written otherwise) and text done events."""
    number = iter(range(10_000))
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    events = [_named("response.created", {"type": "response.created", "sequence_number": next(number), "response": response})]
    function = draw(st.booleans())
    item = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "add", "arguments": ""} if function else \
        {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    events.append(_named("response.output_item.added", {"type": "response.output_item.added", "sequence_number": next(number),
                                                        "output_index": 0, "item": item}))
    if not function:
        events.append(_named("response.content_part.added", {"type": "response.content_part.added", "sequence_number": next(number),
                                                             "item_id": "msg_1", "output_index": 0, "content_index": 0,
                                                             "part": {"type": "output_text", "text": "", "annotations": []}}))
    name = "response.function_call_arguments.delta" if function else "response.output_text.delta"
    for _ in range(draw(st.integers(0, 40))):
        payload = {"type": name, "sequence_number": next(number), "item_id": item["id"], "output_index": 0}
        if not function:
            payload["content_index"] = 0
        payload["delta"] = draw(TEXTS)
        if not function:
            payload["logprobs"] = []
        event = _named(name, payload)
        spoil = draw(st.integers(0, 30))
        if spoil == 1:
            event = event.replace(b'"sequence_number":', b'"sequence_number":0', 1)  # 0123: not JSON.
        elif spoil == 2:
            event = event.replace(b'"logprobs":[]', b'"logprobs":[{"token":"x","logprob":-1.0,"bytes":[120],"top_logprobs":[]}]', 1)
        events.append(event)
    events.append(_named("response.completed", {"type": "response.completed", "sequence_number": next(number),
                                                "response": {**response, "status": "completed"}}))
    return b"".join(events)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(messages_stream().map(lambda body: ("messages", body)), responses_stream().map(lambda body: ("responses", body))))
def test_messages_and_responses_templates_capture_what_the_general_way_does(case):
    dialect, body = case
    events = [event + b"\n\n" for event in body.split(b"\n\n")[:-1]]
    rng = random.Random(len(body))
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, 12)))
    for pieces in ([body], events, [b"".join(events[at:at + 6]) for at in range(0, len(events), 6)],
                   [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]):
        fast, slow = StreamTap(dialect, learn_after=0), StreamTap(dialect, templates=False)
        assert [fast.feed(piece) for piece in pieces] == [slow.feed(piece) for piece in pieces]
        assert fast._parser.field_lines == slow._parser.field_lines
        assert fast.finish(200) == slow.finish(200)


def test_messages_and_responses_runs_are_taken():
    text = [_named("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": f" t{i}"}})
            for i in range(20)]
    body = (_named("message_start", {"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": []}})
            + _named("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            + b"".join(text) + _named("content_block_stop", {"type": "content_block_stop", "index": 0})
            + _named("message_stop", {"type": "message_stop"}))
    tap = StreamTap("messages", learn_after=0)
    assert tap.feed(body)
    assert tap.templated_events == 19
    assert tap.finish(200).response["content"] == [{"type": "text", "text": "".join(f" t{i}" for i in range(20))}]


#: Parts a run may meet: one that fits the template below, and each way one does not.
_PARTS = {"fits": b'data: {"v":"abc"}', "head": b'data: {"w":"abc"}', "tail": b'data: {"v":"abc"]',
          "short": b'data: {"v":"', "long": b'data: {"v":"' + b"x" * 64 + b'"}'}


@given(st.lists(st.sampled_from(["fits"] * 8 + sorted(_PARTS)), max_size=40), st.integers(0, 6))
def test_a_run_is_as_long_as_its_parts_fit_one_by_one(names, start):
    """`EventTemplate.take_run`: a run is the parts from ``start`` on that fit the template, up to
    the first that does not (another head, another end, too short, too long)."""
    payload = {"v": "abc"}
    template = learn_template(b"data: ", orjson.dumps(payload), payload, [("v", ("v",), TEXT)])[0]
    template.maximum = 40
    parts = [_PARTS[name] for name in names]
    expected = 0
    for name in names[start:]:
        if name != "fits":
            break
        expected += 1
    assert template.take_run(parts, start)[0] == expected
