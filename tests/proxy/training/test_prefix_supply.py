"""Prefix supply (issue 32) against a scripted vLLM-shaped server: the prompt a drifting turn is
sent on, its proof, and the learned fallbacks (no renderer; the field refused). The real thing is
in the vLLM tier (`tests/vllm_conformance`)."""

from __future__ import annotations

from typing import Any, Optional

import orjson

from capture import render_requests
from records import read_token_entries, read_token_records
from tests.scripted_upstream import Script
from tests.wire import fetch, rollout_url

_JSON = {"Content-Type": "application/json"}
_ROLES = {"system": 101, "user": 102, "assistant": 103, "tool": 104}
_END, _NEWLINE, _THINK = 2, 10, 7


def render(messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    """A toy chat template: each turn is its role, its text's characters, end, newline; a sent-back
    assistant turn renders its text only (the reasoning token it was generated with is gone)."""
    ids = []
    for message in messages:
        ids += [_ROLES[message["role"]], *map(ord, message.get("content") or ""), _END, _NEWLINE]
    return ids + ([_ROLES["assistant"]] if add_generation_prompt else [])


class ToyVllm:
    """Chat and ``/tokenize`` as vLLM 0.32 answers them: ``kv_transfer_params.prompt_token_ids``
    replaces the rendered prompt; the reply's ``prompt_token_ids`` is the prompt used."""

    def __init__(self, tokenize_status: int = 200, refuse_kv: bool = False, down_at_start: bool = False) -> None:
        self.tokenize_status, self.refuse_kv = tokenize_status, refuse_kv
        #: The sidecar's renderer probe at start gets no HTTP answer (a model server still starting).
        self.down_at_start = down_at_start
        self.chats: list[dict[str, Any]] = []
        self.renders = 0

    def __call__(self, request) -> Optional[Script]:
        if request.target == "/server_info":
            return None  # 404: not SGLang.
        body = orjson.loads(request.body)
        if request.target == "/tokenize":
            self.renders += 1
            if self.down_at_start and self.renders == 1:
                return Script(garbage=b"\x00")
            if self.tokenize_status != 200:
                return _json(b'{"detail":"Not Found"}', self.tokenize_status)
            return _json(orjson.dumps({"count": 0, "max_model_len": 4096, "tokens": render(
                body["messages"], body.get("add_generation_prompt", True))}))
        self.chats.append(body)
        if self.refuse_kv and "kv_transfer_params" in body:
            return _json(b'{"detail":[{"type":"extra_forbidden","loc":["body","kv_transfer_params"],'
                         b'"msg":"Extra inputs are not permitted"}]}', 422)
        supplied = (body.get("kv_transfer_params") or {}).get("prompt_token_ids")
        prompt = supplied or render(body["messages"], True)
        generated = [_THINK, ord("o"), ord("k"), _END]
        asked = bool(body.get("return_token_ids"))
        return _json(orjson.dumps({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                         "logprobs": {"content": [{"token": "t", "logprob": -0.25, "bytes": [116], "top_logprobs": []}
                                                  for _ in generated]} if body.get("logprobs") else None,
                         "finish_reason": "stop", "token_ids": generated if asked else None}],
            "prompt_token_ids": prompt if asked else None}))


def _json(body: bytes, status: int = 200) -> Script:
    reasons = {200: "OK", 404: "Not Found", 422: "Unprocessable Entity"}
    return Script(status=status, reason=reasons[status], pieces=[body],
                  headers=[("Content-Type", "application/json"), ("Content-Length", str(len(body)))])


async def _turns(http, sidecar, rollout: str, count: int) -> list[bytes]:
    messages = [{"role": "user", "content": "hi"}]
    replies = []
    for turn in range(count):
        reply = await fetch(http, "POST", rollout_url(sidecar.url, rollout, "/v1/chat/completions"),
                            orjson.dumps({"model": "m", "messages": messages}), headers=_JSON)
        replies.append(reply.body)
        messages = [*messages, {"role": "assistant", "content": "ok"}, {"role": "user", "content": f"more {turn}"}]
    return replies


async def test_a_drifting_turn_is_sent_on_its_parents_exact_ids_with_proof(http, upstream, start, capture_dir, store):
    model = upstream.responder = ToyVllm()
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True, supply_prefix=True)
    replies = await _turns(http, sidecar, "fed", 3)
    assert all(b"prompt_token_ids\":null" in reply for reply in replies), "the agent's view: nothing added shows"
    first, second, third = read_token_records(store, "fed")
    parent = [*first.prompt_token_ids, *first.generation_token_ids]
    # The parent's sequence, the template's newline after its end token (the generation ended on
    # it), then the new user turn and the generation prompt -- as the template renders them.
    expected = [*parent, _NEWLINE, _ROLES["user"], *map(ord, "more 0"), _END, _NEWLINE, _ROLES["assistant"]]
    assert model.chats[1]["kv_transfer_params"] == {"prompt_token_ids": expected}
    assert second.prompt_token_ids == expected and third.prompt_token_ids[:len(second.prompt_token_ids)] == \
        [*second.prompt_token_ids[:len(expected)]]
    assert [r.prefix_supplied for r in (first, second, third)] == [None, True, True]
    assert [r.extends for r in (first, second, third)] == [None, 0, 1] and not any(r.drift_at for r in (second, third))
    entries = read_token_entries(capture_dir, "fed")
    assert [(e["prefix_requested"], e["prefix_supplied"], e["prompt_is_delta"]) for e in entries] == [
        (False, False, False), (True, True, True), (True, True, True)]
    assert model.renders == 1 + 6, "the probe at start, then three renders a supplied turn, sent at once"

    plain = upstream.responder = ToyVllm()
    natural = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True, supply_prefix=False)
    await _turns(http, natural, "natural", 2)
    _, drifting = read_token_records(store, "natural")
    assert drifting.drift_at == len(parent) - 4 and drifting.prefix_supplied is None, "the reasoning token is gone"
    assert plain.renders == 0 and "kv_transfer_params" not in plain.chats[1]


async def test_supply_is_on_by_default_in_the_token_mode_and_off_when_told(http, upstream, start, capture_dir, store,
                                                                             caplog):
    """Issue 72: ``--capture-tokens`` alone supplies each turn's prefix where the upstream renders
    (learnt at start, said in the log); ``--no-supply-prefix`` sends turns as written, and says so."""
    upstream.responder = ToyVllm()
    with caplog.at_level("INFO", logger="mcc"):
        sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    assert any(record.getMessage().startswith("prefix supply: on (POST /tokenize renders the chat template)")
               for record in caplog.records), [record.getMessage() for record in caplog.records]
    await _turns(http, sidecar, "default", 2)
    assert [record.prefix_supplied for record in read_token_records(store, "default")] == [None, True]
    caplog.clear()
    plain = upstream.responder = ToyVllm()
    with caplog.at_level("INFO", logger="mcc"):
        off = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True, supply_prefix=False)
    assert any(record.getMessage().startswith("prefix supply: off (--no-supply-prefix)") for record in caplog.records)
    await _turns(http, off, "off", 2)
    assert plain.renders == 0 and all("kv_transfer_params" not in chat for chat in plain.chats)
    assert [line.get("prefix_not_supplied") for line in store.read("off")] == [None, None]


async def test_an_upstream_without_a_renderer_is_learnt_at_start(http, upstream, start, capture_dir, store, caplog):
    model = upstream.responder = ToyVllm(tokenize_status=404)
    with caplog.at_level("INFO", logger="mcc"):
        sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    said = [record for record in caplog.records if record.getMessage().startswith("prefix supply: off")]
    assert [record.levelname for record in said] == ["WARNING"] and "POST /tokenize answered 404" in said[0].getMessage()
    await _turns(http, sidecar, "bare", 3)
    assert model.renders == 1, "the probe at start only: never asked again"
    assert all("kv_transfer_params" not in chat for chat in model.chats)
    lines = store.read("bare")
    assert [line.get("prefix_not_supplied") for line in lines] == [None, "no_renderer", "no_renderer"]
    metrics = (await fetch(http, "GET", sidecar.url + "/-/metrics")).body.decode()
    assert 'mcc_prefix_supply_total{outcome="no_renderer"} 2.0' in metrics


async def test_an_upstream_not_answering_at_start_is_learnt_at_the_first_turn(http, upstream, start, capture_dir, store):
    model = upstream.responder = ToyVllm(tokenize_status=404, down_at_start=True)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)  # The probe's answer: garbage.
    await _turns(http, sidecar, "late", 3)
    assert model.renders == 1 + 3, "the probe, then one round of three renders, never again"
    lines = store.read("late")
    assert [line.get("prefix_not_supplied") for line in lines] == [None, "no_renderer", "no_renderer"]


async def test_a_refused_prefix_is_resent_as_the_agents_own_request_and_learnt(http, upstream, start, capture_dir, store):
    model = upstream.responder = ToyVllm(refuse_kv=True)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True, supply_prefix=True)
    replies = await _turns(http, sidecar, "refused", 4)
    assert all(reply.startswith(b'{"id":"chatcmpl-1"') for reply in replies), "every call answered"
    with_kv = ["kv_transfer_params" in chat for chat in model.chats]
    assert with_kv == [False, True, False, False, False], "refused once: the agent's own request resent, never again"
    assert "return_token_ids" not in model.chats[2], "the resend is the agent's own request"
    lines = store.read("refused")
    # The resent call has no arrays (the agent asked for none), so the next one continues no
    # entry (unresolved: nothing to supply); the one after continues that one, and is not supplied.
    assert [line.get("prefix_not_supplied") for line in lines] == [None, "refused", None, "refused_before"]
    assert "prefix_supplied" not in lines[1]


def test_render_requests_take_the_last_assistant_turn_and_keep_what_renders():
    request = {"model": "m", "tools": [{"type": "function"}], "chat_template_kwargs": {"x": 1}, "temperature": 1,
               "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                            {"role": "tool", "content": "c"}, {"role": "assistant", "content": "d"},
                            {"role": "user", "content": "e"}]}
    renders = render_requests(request)
    assert renders is not None and renders.turn == 3
    head_a, head_b, tail = renders.bodies()
    assert head_a["messages"][-1] == {"role": "assistant", "content": "A"} and head_b["messages"][-1]["content"] == "B"
    assert tail["messages"][3:] == [{"role": "assistant", "content": "A"}, {"role": "user", "content": "e"}]
    assert {name for name in head_a if name not in ("messages", "add_generation_prompt", "continue_final_message")} == {
        "model", "tools", "chat_template_kwargs"}, "what changes the render, not the sampling"
    assert render_requests({"messages": [{"role": "user", "content": "a"}]}) is None, "a root: nothing to supply"
    assert render_requests({**request, "kv_transfer_params": {}}) is None, "the agent's own field"
    # Not prefix-stable: the tail does not begin with the head.
    assert renders.prompt([1, 2], [5, 6], [7, 6], [9, 9, 9]) == (None, "template_not_prefix_stable")
    # The generation ended with the turn's first end token: only the rest is added.
    assert renders.prompt([1, 2, 3], [5, 6, 3, 4], [5, 7, 3, 4], [5, 6, 3, 4, 8]) == ([1, 2, 3, 4, 8], "")
    resumed = render_requests({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                               "continue_final_message": True})
    assert resumed is not None and resumed.resumes_in_place and resumed.prompt([1, 2], [], [], []) == ([1, 2], "")


def test_a_responses_request_is_rendered_as_the_chat_messages_vllm_builds():
    """The parent's turn (its last run of model-written items) becomes one assistant message; the new
    turn's text messages and function-call outputs become what vLLM builds of them; the rest is
    shared by the three renders. What cannot be rendered so is None."""
    from capture import responses_render_request

    items = [{"role": "user", "content": "hi"},
             {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]},
             {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
             {"role": "user", "content": [{"type": "input_text", "text": "and "}, {"type": "input_text", "text": "now?"}]}]
    chat = responses_render_request({"model": "m", "instructions": "be terse", "input": items,
                                     "tools": [{"type": "function", "name": "look", "parameters": {"type": "object"}}]})
    assert chat == {"model": "m", "tools": [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}],
                    "messages": [{"role": "system", "content": "be terse"}, {"role": "user", "content": "hi"},
                                 {"role": "assistant", "content": ""},
                                 {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                                 {"role": "user", "content": "and now?"}]}
    assert render_requests(chat).turn == 2
    assert responses_render_request({"input": "hi"}) is None, "no turn of the model's"
    assert responses_render_request({"input": items[:1]}) is None
    assert responses_render_request({"input": items, "previous_response_id": "resp_1"}) is None
    assert responses_render_request({"input": items, "tools": [{"type": "web_search"}]}) is None
    image = {"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}
    assert responses_render_request({"input": [*items, image]}) is None


async def test_a_responses_turn_sent_back_is_supplied_and_proved_on_the_stand_in(http, stand_in, start, capture_dir,
                                                                                store):
    """Responses turns, the output items sent back, under the stand-in's template that drops the
    reasoning (drift without supply): with the token mode's defaults every later turn is sent on its
    parent's exact ids, proved by the reply's ``input_messages``, and the rollout is one chain."""
    from records import trajectories

    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    headers = {**_JSON, "X-Stand-In-Template": "drop-reasoning"}
    items: list[Any] = [{"role": "user", "content": "Write a haiku."}]
    for turn in range(3):
        reply = await fetch(http, "POST", rollout_url(sidecar.url, "resp", "/v1/responses"),
                            orjson.dumps({"model": "m", "input": items}), headers=headers)
        response = orjson.loads(reply.body)
        assert response.get("input_messages") is None, "the agent's view: what the mode added is cut"
        items += [*response["output"], {"role": "user", "content": f"Again ({turn})."}]
    records = read_token_records(store, "resp")
    assert [record.prefix_supplied for record in records] == [None, True, True]
    assert [record.extends for record in records] == [None, 0, 1]
    build = trajectories(capture_dir, "resp")
    assert not build.masked, build.mask_reason
    plain = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True, supply_prefix=False)
    items = [{"role": "user", "content": "Write a haiku."}]
    for turn in range(2):
        reply = await fetch(http, "POST", rollout_url(plain.url, "resp-plain", "/v1/responses"),
                            orjson.dumps({"model": "m", "input": items}), headers=headers)
        items += [*orjson.loads(reply.body)["output"], {"role": "user", "content": f"Again ({turn})."}]
    assert trajectories(capture_dir, "resp-plain").masked, "without supply the dropped reasoning drifts"
