"""A real vLLM 0.32.0 behind the sidecar, every dialect, with and without the token capture mode
(issue 20). Run by `make vllm-conformance` (and `.ci/run`); skipped, with the reason, where vLLM
cannot be installed. ``MCC_VLLM_URL`` points the tier at a vLLM already running instead.

Every reply through the sidecar is compared with a direct call to the same server made right
beside it. vLLM makes ids and timestamps fresh per call, and under load its API server may merge
several tokens into one delta (SOURCES.md of the recordings), so the bytes are compared with ids
and timestamps normalised, and a mismatch is retried a few times before it counts. With n > 1 streamed,
the order in which vLLM interleaves the choices' chunks is its scheduler's (and the token mode's
request, which asks for logprobs, is not the direct call's), so such streams are compared choice by
choice: every event, byte for byte, in its order within its choice (`by_choice`).
"""

from __future__ import annotations

import os
import re
from typing import Any

import orjson
import pytest

from records import build_model_call_record, read_token_records
from tests.conformance.vllm_recordings import normalised
from tests.wire import fetch, rollout_url

from .vllm_server import SERVED_NAME, vllm_or_skip

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3600)]

_SYSTEM = {"role": "system", "content": "You are terse."}
_USER = {"role": "user", "content": "Write a small Python function."}
_TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a name up.", "parameters": {
    "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}}
_SAMPLING = {"temperature": 1.0, "seed": 7}
_PROMPT = "def add(a, b):\n"

#: What agents send, by case: (path, body). None of them asks for token ids or logprobs.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"model": SERVED_NAME, "messages": [_SYSTEM, _USER], "max_tokens": 24, **_SAMPLING}),
    "chat-stream": ("/v1/chat/completions", {"model": SERVED_NAME, "messages": [_SYSTEM, _USER], "max_tokens": 24,
                                             "stream": True, "stream_options": {"include_usage": True}, **_SAMPLING}),
    "chat-n2-stream": ("/v1/chat/completions", {"model": SERVED_NAME, "messages": [_USER], "max_tokens": 12, "n": 2,
                                                "stream": True, **_SAMPLING}),
    "chat-tools-required-stream": ("/v1/chat/completions", {
        "model": SERVED_NAME, "messages": [_USER], "tools": [_TOOL], "tool_choice": "required", "max_tokens": 60,
        "stream": True, **_SAMPLING}),
    "completions": ("/v1/completions", {"model": SERVED_NAME, "prompt": _PROMPT, "max_tokens": 16, **_SAMPLING}),
    "completions-stream": ("/v1/completions", {"model": SERVED_NAME, "prompt": _PROMPT, "max_tokens": 16, "stream": True,
                                               "stream_options": {"include_usage": True}, **_SAMPLING}),
    "completions-n2": ("/v1/completions", {"model": SERVED_NAME, "prompt": _PROMPT, "max_tokens": 8, "n": 2, **_SAMPLING}),
    "responses": ("/v1/responses", {"model": SERVED_NAME, "input": "Write a small Python function.",
                                    "max_output_tokens": 24, **_SAMPLING}),
    "responses-stream": ("/v1/responses", {"model": SERVED_NAME, "input": "Write a small Python function.",
                                           "max_output_tokens": 24, "stream": True, **_SAMPLING}),
    # vLLM's Anthropic endpoint has no ``seed``: greedy, so that two calls agree.
    "messages": ("/v1/messages", {"model": SERVED_NAME, "max_tokens": 24, "messages": [_USER], "temperature": 0}),
    "messages-stream": ("/v1/messages", {"model": SERVED_NAME, "max_tokens": 24, "messages": [_USER], "stream": True,
                                         "temperature": 0}),
}
#: The fields the mode adds, by dialect (docs/tokens.md, capture/_token_request.py); vLLM 0.32 ignores
#: ``return_weight_versions`` (0.33's, issue 32) and replies with the same bytes.
ADDED = {"/v1/chat/completions": {"logprobs": True, "return_token_ids": True, "return_weight_versions": True},
         "/v1/completions": {"logprobs": 0, "return_token_ids": True, "return_weight_versions": True},
         "/v1/responses": {"include": ["message.output_text.logprobs"], "enable_response_messages": True},
         "/v1/messages": None}
_TRIES = 6
_JSON = {"Content-Type": "application/json"}


class SpanReceiver:
    """An OTLP/HTTP trace receiver on loopback: keeps every ``ExportTraceServiceRequest`` posted."""

    def __init__(self) -> None:
        import http.server
        import threading

        self.bodies: list[bytes] = []
        bodies = self.bodies

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                bodies.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list[Any]:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        found = []
        for body in list(self.bodies):
            request = ExportTraceServiceRequest.FromString(body)
            found += [span for resource in request.resource_spans for scope in resource.scope_spans for span in scope.spans]
        return found


@pytest.fixture(scope="module")
def span_receiver():
    receiver = SpanReceiver()
    yield receiver
    receiver.server.shutdown()


@pytest.fixture(scope="module")
def vllm_url(span_receiver):
    yield from vllm_or_skip(otlp_traces_endpoint=span_receiver.url)


async def _beside(http, sidecar_url: str, vllm_url: str, path: str, body: bytes, rollout: str):
    """A direct call and a call through the sidecar, retried until the two agree (or tries run out).
    The direct call carries a ``traceparent`` too, as the sidecar's does (`--trace-context`): vLLM
    traces both, so both are served alike."""
    for attempt in range(_TRIES):
        traced = {**_JSON, "traceparent": f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"}
        direct = await fetch(http, "POST", vllm_url + path, body, headers=traced)
        proxied = await fetch(http, "POST", rollout_url(sidecar_url, f"{rollout}-{attempt}", path), body, headers=_JSON)
        if _same(proxied.body, direct.body):
            break
    return direct, proxied, f"{rollout}-{attempt}"


_INDEX = re.compile(rb'"choices":\[\{"index":(\d+)')


def by_choice(body: bytes) -> bytes:
    """A stream's events (ids and timestamps normalised) with each choice's chunks together, in their
    order within the choice; events naming no choice (usage, ``[DONE]``) after them, in their order."""
    events = normalised(body).split(b"\n\n")
    tail = events.pop() if events and events[-1] == b"" else None

    def choice(event: bytes) -> int:
        found = _INDEX.search(event)
        return int(found.group(1)) if found else 1 << 30

    ordered = sorted(events, key=choice)
    return b"\n\n".join(ordered + ([tail] if tail is not None else []))


def _same(proxied: bytes, direct: bytes) -> bool:
    return by_choice(proxied) == by_choice(direct)


def _first_difference(proxied: bytes, direct: bytes) -> str:
    left, right = by_choice(proxied), by_choice(direct)
    at = next((i for i, (a, b) in enumerate(zip(left, right)) if a != b), min(len(left), len(right)))
    return f"through the sidecar: {left[max(0, at - 300):at + 200]!r}\ndirect: {right[max(0, at - 300):at + 200]!r}"


@pytest.mark.parametrize("mode", ["plain", "token-capture"])
@pytest.mark.parametrize("case", list(CASES))
async def test_every_dialect_through_the_sidecar_is_what_vllm_sends(vllm_url, http, start, capture_dir, store, case, mode):
    path, request = CASES[case]
    sidecar = await start(vllm_url, capture_dir=capture_dir, capture_tokens=mode == "token-capture")
    body = orjson.dumps(request)
    direct, proxied, rollout = await _beside(http, sidecar.url, vllm_url, path, body, case)
    assert (proxied.status, proxied.reason) == (direct.status, direct.reason) == (200, "OK")
    assert _same(proxied.body, direct.body), _first_difference(proxied.body, direct.body)
    assert [name for name, _ in proxied.headers] == [name for name, _ in direct.headers]
    (line,) = store.read(rollout)
    assert line["error_category"] in (None, "incomplete"), line.get("failure")
    record = build_model_call_record(line, 0)
    if not request.get("stream") or request.get("stream_options") or path in ("/v1/responses", "/v1/messages"):
        assert record.tokens_out is not None and record.tokens_out > 0  # Usage where vLLM sends it.
    added = ADDED[path] if mode == "token-capture" else None
    assert line.get("added_request_fields") == added
    if added is None:
        return
    tokens = read_token_records(store, rollout)
    assert len(tokens) == request.get("n", 1)
    for token_record in tokens:
        assert token_record.prompt_token_ids and token_record.generation_token_ids, token_record
        assert token_record.source == "token_file", "the arrays live once, in the training-token file (issue 31)"
        if path != "/v1/responses":  # Responses streams send no logprob for a token whose text is empty.
            assert token_record.usable, token_record.unusable_reason
            assert len(token_record.generation_log_probs or ()) == len(token_record.generation_token_ids)


async def test_prompt_ids_equal_vllms_own_tokenize(vllm_url, http, start, capture_dir, store):
    """The prompt ids the mode captures are what vLLM's /tokenize makes of the same messages and tools."""
    sidecar = await start(vllm_url, capture_dir=capture_dir, capture_tokens=True)
    path, request = CASES["chat-tools-required-stream"]
    await fetch(http, "POST", rollout_url(sidecar.url, "tok", path), orjson.dumps(request), headers=_JSON)
    (record,) = read_token_records(store, "tok")
    tokenized = await fetch(http, "POST", vllm_url + "/tokenize", orjson.dumps(
        {"model": SERVED_NAME, "messages": request["messages"], "tools": request["tools"], "add_generation_prompt": True}),
        headers=_JSON)
    assert record.prompt_token_ids == orjson.loads(tokenized.body)["tokens"]


async def test_a_second_turn_extends_the_first_or_says_where_it_drifts(vllm_url, http, start, capture_dir, store):
    """Multi-turn drift on a real chat template: the second call's prompt begins with the first
    call's prompt and generation, or `drift_at` says where it departs."""
    sidecar = await start(vllm_url, capture_dir=capture_dir, capture_tokens=True)
    path, first = CASES["chat"]
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "turns", path), orjson.dumps(first), headers=_JSON)
    said = orjson.loads(reply.body)["choices"][0]["message"]["content"]
    second = {**first, "messages": [*first["messages"], {"role": "assistant", "content": said},
                                    {"role": "user", "content": "Again."}]}
    await fetch(http, "POST", rollout_url(sidecar.url, "turns", path), orjson.dumps(second), headers=_JSON)
    earlier, later = read_token_records(store, "turns")
    assert later.extends == 0 or (later.drift_at is not None and later.drift_at <= len(earlier.prompt_token_ids or ()) +
                                  len(earlier.generation_token_ids or ()))


def _vllm_reported(raw: str) -> tuple[list[int], list[int]]:
    """The prompt and generated ids a real vLLM stream carried (first chunk's ``prompt_token_ids``,
    each chunk's ``token_ids``)."""
    from capture import SSEParser
    prompt: list[int] = []
    generated: list[int] = []
    for event in SSEParser().feed(raw.encode()):
        if event.data == "[DONE]":
            continue
        chunk = orjson.loads(event.data)
        prompt = chunk.get("prompt_token_ids") or prompt
        for choice in chunk.get("choices") or ():
            generated += choice.get("token_ids") or []
    return prompt, generated


async def test_a_four_turn_tool_session_is_recorded_as_vllm_reported_it(vllm_url, http, start, capture_dir, store):
    """Issue 31: a 4-turn tool-calling session through --capture-tokens, streamed. Each call's entry
    (its prompt rebuilt from the stored suffix) holds exactly the prompt and generated ids vLLM
    reported for it; each later call is resolved to the one before (its output was sent back); the
    chain is what `records.trajectories` builds, or masked with the reason where the real template
    re-tokenised a turn."""
    from records.training import TokenFileArrays
    from records import read_token_entries, trajectories
    sidecar = await start(vllm_url, capture_dir=capture_dir, capture_tokens=True, capture_raw_stream="always")
    messages: list[dict[str, Any]] = [_SYSTEM, {"role": "user", "content": "Look up Ada, then answer."}]
    for turn in range(4):
        body = {"model": SERVED_NAME, "messages": messages, "tools": [_TOOL], "max_tokens": 40, "stream": True,
                "tool_choice": "required" if turn % 2 == 0 else "none", **_SAMPLING}
        await fetch(http, "POST", rollout_url(sidecar.url, "session", "/v1/chat/completions"), orjson.dumps(body),
                    headers=_JSON)
        line = store.read("session")[-1]
        message = line["response"]["choices"][0]["message"]
        sent_back = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            sent_back["tool_calls"] = message["tool_calls"]
        messages.append(sent_back)
        for call in message.get("tool_calls") or ():
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "Ada Lovelace, 1815-1852"})
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": "And Grace?"})
    lines = store.read("session")
    entries = read_token_entries(capture_dir, "session")
    assert [e["model_call_id"] for e in entries] == [line["model_call_id"] for line in lines]
    assert [e["parent_resolution"] for e in entries] == ["root", "resolved", "resolved", "resolved"]
    assert [e["parent_call_id"] for e in entries[1:]] == [e["model_call_id"] for e in entries[:-1]]
    arrays = TokenFileArrays(capture_dir, "session")
    for line, record in zip(lines, read_token_records(store, "session")):
        assert record.source == "token_file" and record.usable, record
        prompt, generated = _vllm_reported(line["response_raw"])
        assert (record.prompt_token_ids, record.generation_token_ids) == (prompt, generated)
        assert "logprobs" not in orjson.dumps(line["response"]).decode() or line["response"]["choices"][0]["logprobs"] is None
    build = trajectories(capture_dir, "session")
    if not build.masked:
        assert [call.model_call_id for call in build.main.calls] == [e["model_call_id"] for e in entries]
    else:  # The real template re-tokenised a sent-back turn: the link is broken, and said.
        assert "without a verified parent" in build.mask_reason
        assert any(e["prompt_is_delta"] is False for e in entries[1:])
    del arrays


async def test_vllms_own_spans_join_the_rollouts_trace_under_the_call(vllm_url, span_receiver, http, start, capture_dir,
                                                                      store):
    """Issue 33, point 8: the sidecar forwards each captured call with a W3C ``traceparent`` (the
    body byte for byte); vLLM, exporting its spans, continues that context, so its span of the call
    is in the rollout's trace under the call's span, the ids `mcc export --format otel-json` writes."""
    import asyncio
    import time

    from proxy.inspection.export import otel_lines
    from records.store import call_row
    from records.contract.reading import call_span_id, rollout_trace_id

    if os.environ.get("MCC_VLLM_URL"):
        pytest.skip("MCC_VLLM_URL: a vLLM started elsewhere, whose spans go where it was told")
    sidecar = await start(vllm_url, capture_dir=capture_dir)
    path, body = CASES["chat-stream"]
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "traced", path), orjson.dumps(body), _JSON)
    assert reply.status == 200
    (line,) = store.read("traced")
    trace_id, parent_id = bytes.fromhex(rollout_trace_id("traced")), bytes.fromhex(call_span_id(line["model_call_id"]))
    deadline = time.monotonic() + 60
    while not (joined := [span for span in span_receiver.spans() if span.trace_id == trace_id]):
        assert time.monotonic() < deadline, f"no span of the rollout's trace from vLLM ({len(span_receiver.spans())} others)"
        await asyncio.sleep(0.2)
    assert [span.parent_span_id for span in joined] == [parent_id], [span.name for span in joined]
    (exported,) = otel_lines([("traced", [call_row("traced", 0, line)])])
    call = orjson.loads(exported)["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    assert (call["traceId"], call["spanId"]) == (trace_id.hex(), parent_id.hex())


async def _drifting_session(http, sidecar_url: str, rollout: str, turns: int) -> None:
    """A chat session whose replies are sent back as text, streamed: the tiny model's text
    re-tokenizes differently (issue 32), so the natural prompts drift."""
    messages: list[dict[str, Any]] = [_SYSTEM, {"role": "user", "content": "Write a small Python function."}]
    for turn in range(turns):
        body = {"model": SERVED_NAME, "messages": messages, "max_tokens": 8, "stream": True, **_SAMPLING}
        reply = await fetch(http, "POST", rollout_url(sidecar_url, rollout, "/v1/chat/completions"), orjson.dumps(body),
                            headers=_JSON)
        text = "".join(chunk["choices"][0]["delta"].get("content") or ""
                       for chunk in _chunks(reply.body) if chunk.get("choices"))
        messages = [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": f"Again ({turn})."}]


def _chunks(body: bytes) -> list[dict[str, Any]]:
    from capture import SSEParser
    return [orjson.loads(event.data) for event in SSEParser().feed(body) if event.data != "[DONE]"]


async def test_prefix_supply_makes_a_drifting_session_extend_every_turn(vllm_url, http, start, capture_dir, store):
    """Issue 32: with --no-supply-prefix the tiny model's session drifts (the records say where);
    with supply (the token mode's default, issue 72) every later turn is sent on its parent's exact ids, vLLM reports exactly those ids as
    the prompt (the proof), the turn extends its parent, and the trajectory's ids are vLLM's."""
    from records import read_token_entries, trajectories
    plain = await start(vllm_url, capture_dir=capture_dir, capture_tokens=True, supply_prefix=False,
                        capture_raw_stream="always")
    await _drifting_session(http, plain.url, "natural", 4)
    natural = read_token_records(store, "natural")
    assert any(record.drift_at is not None for record in natural[1:]), "the natural session no longer drifts"
    assert all(record.prefix_supplied is None for record in natural)

    supplied = await start(vllm_url, capture_dir=capture_dir, capture_tokens=True, supply_prefix=True,
                           capture_raw_stream="always")
    await _drifting_session(http, supplied.url, "supplied", 4)
    records = read_token_records(store, "supplied")
    lines = store.read("supplied")
    assert [record.prefix_supplied for record in records] == [None, True, True, True]
    assert [record.extends for record in records] == [None, 0, 1, 2]
    assert all(record.drift_at is None and record.usable for record in records)
    for line, record in zip(lines, records):
        assert (record.prompt_token_ids, record.generation_token_ids) == _vllm_reported(line["response_raw"])
        assert line["response"]["prompt_token_ids"] is None  # The agent's view: what the mode added is cut.
    entries = read_token_entries(capture_dir, "supplied")
    assert [(e["prefix_requested"], e["prefix_supplied"], e["prompt_is_delta"]) for e in entries] == \
        [(False, False, False)] + [(True, True, True)] * 3
    build = trajectories(capture_dir, "supplied")
    assert not build.masked, build.mask_reason
    last = records[-1]
    assert build.main.token_ids == [*last.prompt_token_ids, *last.generation_token_ids]


@pytest.mark.parametrize("mode", ["plain", "token-capture"])
async def test_a_websocket_session_of_ten_responses_is_bridged_to_vllm(vllm_url, http, start, capture_dir, store, mode):
    """vLLM serves no WebSocket: the sidecar bridges each ``response.create`` of one socket to a
    streamed POST (issue 44). Ten chained responses: ten lines, each as complete as the same request
    streamed over HTTP through the sidecar (same status, text, usage); the socket's events are the
    stream's; in the token mode each has its training arrays and the agent's events are unchanged."""
    from tests.websockets_wire import RawSocket, create

    # Each line is compared with its request sent again over HTTP as a rollout of its own, where no
    # turn has a parent: prefix supply (which sends a socket's later turns on their parents' ids) off.
    sidecar = await start(vllm_url, capture_dir=capture_dir, capture_tokens=mode == "token-capture",
                          supply_prefix=False)
    socket = await RawSocket.connect(sidecar.url, f"/ng-rollout/ws-{mode}/v1/responses")
    assert socket.status == 101, socket.head
    previous, answered = None, []
    for turn in range(10):
        socket.send_text(create(f"Turn {turn}: write a word.", previous, model=SERVED_NAME, max_output_tokens=8,
                                temperature=0))
        events = await socket.until_ending()
        assert events[-1]["type"] == "response.completed", events[-1]
        answered.append(events)
        previous = events[-1]["response"]["id"]
    socket.close()
    lines = store.read(f"ws-{mode}")
    assert len(lines) == 10 and [line["websocket"]["turn"] for line in lines] == list(range(10))
    for turn, (line, events) in enumerate(zip(lines, answered)):
        assert line["status_code"] == 200 and line["error_category"] in (None, "incomplete"), line.get("failure")
        if mode == "plain":
            assert line["response"]["output"] == events[-1]["response"]["output"]
        else:  # The line keeps the logprobs the mode asked for; the agent's events do not have them.
            assert _output_text(line["response"]) == _output_text(events[-1]["response"])
            assert [item["id"] for item in line["response"]["output"]] == [
                item["id"] for item in events[-1]["response"]["output"]]
        assert len(line["request"]["input"]) > turn  # The socket's context, whole.
        body = orjson.dumps(line["request"])
        over_http = await fetch(http, "POST", rollout_url(sidecar.url, f"http-{mode}-{turn}", "/v1/responses"), body,
                                headers=_JSON)
        assert over_http.status == 200
        (twin,) = store.read(f"http-{mode}-{turn}")
        record, twin_record = build_model_call_record(line, turn), build_model_call_record(twin, 0)
        assert (record.response_status, record.tokens_in, record.tokens_out, record.finish_reason) == (
            twin_record.response_status, twin_record.tokens_in, twin_record.tokens_out, twin_record.finish_reason)
        assert _output_text(line["response"]) == _output_text(twin["response"])
    if mode == "token-capture":
        tokens = read_token_records(store, f"ws-{mode}")
        assert len(tokens) == 10 and all(t.prompt_token_ids and t.generation_token_ids for t in tokens)
        # The arrays the mode asked for were cut from the agent's events: none carries a logprob.
        assert not any(event.get("logprobs") for events in answered for event in events)


def _output_text(response: dict) -> str:
    return "".join(part.get("text", "") for item in response.get("output", []) if item.get("type") == "message"
                   for part in item.get("content", []))


@pytest.mark.parametrize("stream", [False, True])
async def test_a_token_in_session_is_captured_and_is_the_chat_sessions_trajectory(vllm_url, http, start, capture_dir,
                                                                                 store, stream):
    """Issue 57: a chat session (``--supply-prefix``: every turn on its parent's exact ids), then the
    same conversation sent as vLLM renders it, token ids in, to ``/inference/v1/generate`` (what
    verl's and SkyRL's gateways call): each call captured with the agent's bytes vLLM's own, its
    entry resolved to the turn before by its prompt's ids, and the two rollouts' trajectories equal."""
    from records import read_token_entries, trajectories
    sidecar = await start(vllm_url, capture_dir=capture_dir, capture_tokens=True, supply_prefix=True,
                          capture_raw_stream="always")
    await _drifting_session(http, sidecar.url, "as-chat", 3)
    chat = read_token_records(store, "as-chat")
    assert all(record.usable for record in chat)
    sampling = {"max_tokens": 8, **_SAMPLING, "logprobs": 0}
    for record in chat:
        body = {"token_ids": record.prompt_token_ids, "sampling_params": sampling}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        direct = await fetch(http, "POST", vllm_url + "/inference/v1/generate", orjson.dumps(body), headers=_JSON)
        proxied = await fetch(http, "POST", rollout_url(sidecar.url, "as-tokens", "/inference/v1/generate"),
                              orjson.dumps(body), headers=_JSON)
        assert proxied.status == 200 and normalised(proxied.body) == normalised(direct.body), \
            _first_difference(proxied.body, direct.body)
    lines = store.read("as-tokens")
    assert [line["dialect"] for line in lines] == ["generate"] * 3 and all(line["error_category"] is None for line in lines)
    entries = read_token_entries(capture_dir, "as-tokens")
    assert [e["parent_resolution"] for e in entries] == ["root", "resolved", "resolved"]
    assert [e["parent_call_id"] for e in entries[1:]] == [e["model_call_id"] for e in entries[:-1]]
    tokens = read_token_records(store, "as-tokens")
    assert [(r.prompt_token_ids, r.generation_token_ids) for r in tokens] == \
        [(r.prompt_token_ids, r.generation_token_ids) for r in chat], "the same ids as the chat session's"
    as_chat, as_tokens = trajectories(capture_dir, "as-chat"), trajectories(capture_dir, "as-tokens")
    assert not as_chat.masked and not as_tokens.masked, (as_chat.mask_reason, as_tokens.mask_reason)
    assert (as_tokens.main.token_ids, as_tokens.main.loss_mask) == (as_chat.main.token_ids, as_chat.main.loss_mask)
    assert [(c.start, c.end) for c in as_tokens.main.calls] == [(c.start, c.end) for c in as_chat.main.calls]
    assert as_tokens.main.logprobs == pytest.approx(as_chat.main.logprobs, abs=1e-3)


async def test_routed_experts_of_a_two_turn_rollout_are_stored_once_and_aligned(vllm_url, http, start, capture_dir,
                                                                               store):
    """Issue 57, for an engine that returns routed experts (a vLLM started with
    ``--enable-return-routed-experts``, reached through ``MCC_VLLM_URL``; the CPU build this tier
    starts refuses the flag, so here it skips, saying so): each turn's agent bytes are a direct
    call's; the stored rows are the reply's own rows from the parent's last token on, once, and
    the trajectory's routing has a row per token but the last."""
    from records import read_routed_experts, read_token_entries, trajectories
    path, first = CASES["chat"]
    probe = orjson.loads((await fetch(http, "POST", vllm_url + path, orjson.dumps(first), headers=_JSON)).body)
    if probe["choices"][0].get("routed_experts") is None:
        pytest.skip("this vLLM returns no routed_experts (not started with --enable-return-routed-experts; "
                    "vLLM 0.32's CPU build refuses the flag): set MCC_VLLM_URL to an MoE vLLM with it")
    sidecar = await start(vllm_url, capture_dir=capture_dir, capture_tokens=True, supply_prefix=True,
                          capture_routed_experts=True)
    body = dict(first)
    for turn in range(2):
        direct, proxied, rollout = await _beside(http, sidecar.url, vllm_url, path, orjson.dumps(body), f"moe-{turn}")
        assert normalised(proxied.body) == normalised(direct.body), _first_difference(proxied.body, direct.body)
        await fetch(http, "POST", rollout_url(sidecar.url, "moe", path), orjson.dumps(body), headers=_JSON)
        said = orjson.loads(proxied.body)["choices"][0]["message"]["content"]
        body = {**body, "messages": [*body["messages"], {"role": "assistant", "content": said},
                                     {"role": "user", "content": "Again."}]}
    entries = read_token_entries(capture_dir, "moe")
    assert all(e["routed_experts"] is not None for e in entries), [e["routed_experts"] for e in entries]
    build = trajectories(capture_dir, "moe")
    assert not build.masked, build.mask_reason
    aligned = read_routed_experts(capture_dir, "moe", build.main)
    assert aligned is not None and aligned.rows == len(build.main.token_ids) - 1
    assert sum(e["routed_experts"]["shape"][0] for e in entries) == aligned.rows, "each row stored once"
    assert (aligned.to_numpy() >= 0).all(), "no row missing"
