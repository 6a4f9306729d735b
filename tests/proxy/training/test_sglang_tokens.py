"""SGLang in the token capture mode (docs/tokens.md): ``logprobs`` and the ``sglext`` id flags added to a
chat request, the ``sglext`` ids and the logprobs cut from what the agent sees -- a JSON reply's
``sglext`` member whole, a stream's ``sglext`` chunk dropped -- the ids and logprobs written as the
same training entries as vLLM's, SGLang's ``weight_version`` kept.

The expected bytes are the stand-in's SGLang reply to the agent's own request (`proxy.standin.sglang`,
shaped after SGLang's ``serving_chat.py``), derived apart from the cutter, and compared whole, byte
by byte and at random splits."""

from __future__ import annotations

import logging
import random

import orjson
import pytest

from capture import AddedFieldCutter, SGLANG_TOKEN_FIELDS, token_fields_to_add
from proxy.standin import start_stand_in
from proxy.standin.replies import make_plan
from proxy.standin.sglang import sglang_chat_events, sglang_chat_reply
from records import read_token_entries, read_token_records, trajectories
from tests.wire import fetch, rollout_url

ADDED = dict(SGLANG_TOKEN_FIELDS["chat"])
SYSTEM = {"role": "system", "content": "You are terse."}


@pytest.fixture
async def sglang():
    server = await start_stand_in(engine="sglang")
    yield server
    await server.close()


def _splits(data: bytes, seed: int) -> dict[str, list[bytes]]:
    rng = random.Random(seed)
    splits = {"whole": [data], "byte by byte": [data[i:i + 1] for i in range(len(data))]}
    for attempt in range(12):
        cuts = sorted(rng.sample(range(1, len(data)), min(10, len(data) - 1)))
        splits[f"random {attempt}"] = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    return splits


@pytest.mark.parametrize("own", [{}, {"logprobs": True}, {"logprobs": False, "stream_options": {"include_usage": True}}])
@pytest.mark.parametrize("text", ["Hello there, friend.", "x", "Ünïcode ✓ text with \"quotes\" and\nlines"])
def test_the_cut_reply_is_the_reply_to_the_agents_own_request_at_every_split(own, text):
    plan = make_plan(64, text, None, False, 3, None)
    plan = plan.__class__(**{**plan.__dict__, "text": text})
    sent = {**own, **{name: value for name, value in ADDED.items() if name not in own}}
    added = {name: value for name, value in ADDED.items() if name not in own}
    include_usage = bool(own.get("stream_options"))
    # A stream: every split of the upstream's bytes, fed to the cutter, gives the agent's own stream.
    upstream = b"".join(sglang_chat_events(sglang_chat_reply(plan, 3, 1, sent, "v1"), include_usage))
    expected = b"".join(sglang_chat_events(sglang_chat_reply(plan, 3, 1, own, "v1"), include_usage))
    assert upstream != expected
    for name, pieces in _splits(upstream, len(text)).items():
        cutter = AddedFieldCutter("chat", added, own)
        assert b"".join([*(cutter.feed(piece) for piece in pieces), cutter.close()]) == expected, name
        assert cutter.uncut_events == 0 and cutter.dropped_events == 1
    # A JSON reply: the sglext member and the logprobs the agent did not ask for go.
    body = orjson.dumps(sglang_chat_reply(plan, 3, 1, sent, "v1"))
    assert AddedFieldCutter("chat", added, own).cut_body(body) == orjson.dumps(sglang_chat_reply(plan, 3, 1, own, "v1"))


def test_a_request_that_asks_for_sglext_itself_gets_nothing_added():
    for own in ({"return_routed_experts": True}, {"return_output_ids_in_sglext": True}, {"return_cached_tokens_details": True}):
        assert token_fields_to_add("chat", {"messages": [], **own}, engine="sglang") == {}
    assert token_fields_to_add("chat", {"messages": []}, engine="sglang") == ADDED
    assert token_fields_to_add("completions", {"prompt": "x"}, engine="sglang") == {}, "chat only"


async def _turns(http, direct_url: str, sidecar, rollout: str, stream: bool) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Say hello."}]
    for turn in range(3):
        body = {"model": "m", "messages": messages}
        if stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        raw = orjson.dumps(body)
        direct = await fetch(http, "POST", direct_url + "/v1/chat/completions", raw)
        proxied = await fetch(http, "POST", rollout_url(sidecar.url, rollout, "/v1/chat/completions"), raw)
        assert (proxied.status, proxied.body) == (direct.status, direct.body), "the agent's bytes are SGLang's to its own request"
        assert b"sglext" not in proxied.body and b'"logprobs":{' not in proxied.body
        said = sglang_said(proxied.body, stream)
        messages = [*messages, {"role": "assistant", "content": said}, {"role": "user", "content": f"Again ({turn})."}]


def sglang_said(body: bytes, stream: bool) -> str:
    if not stream:
        return orjson.loads(body)["choices"][0]["message"]["content"]
    text = ""
    for event in body.split(b"\n\n"):
        data = event.removeprefix(b"data: ")
        if data and data != b"[DONE]":
            for choice in orjson.loads(data)["choices"]:
                text += choice["delta"].get("content") or ""
    return text


@pytest.mark.parametrize("stream", [False, True])
async def test_a_sglang_rollout_is_captured_as_vllms_is(http, sglang, start, capture_dir, store, caplog, stream):
    caplog.set_level(logging.INFO, logger="mcc")
    sidecar = await start(sglang.url, capture_dir=capture_dir, capture_tokens=True)  # --engine auto: asked.
    assert any("the upstream is SGLang" in record.getMessage() for record in caplog.records)
    await _turns(http, sglang.url, sidecar, "sg", stream)
    records = read_token_records(store, "sg")
    lines = store.read("sg")
    assert all(record.usable and record.source == "token_file" for record in records), records
    for line, record in zip(lines, records):
        assert "sglext" not in line["response"], "the line is what the agent saw"
        # SGLang names the weights in a JSON reply's metadata only (its stream carries none).
        assert (record.weight_versions, record.weight_version_source) == (
            (None, None) if stream else ([{"version": "default", "start": 0, "end": None}], "engine"))
    entries = read_token_entries(capture_dir, "sg")
    assert [e["parent_resolution"] for e in entries] == ["root", "resolved", "resolved"]
    assert [e.get("weight_versions") for e in entries] == [
        None if stream else [{"version": "default", "start": 0, "end": len(e["generation_token_ids"])}] for e in entries]
    build = trajectories(capture_dir, "sg")
    assert not build.masked, build.mask_reason
    last = records[-1]
    assert build.main.token_ids == [*last.prompt_token_ids, *last.generation_token_ids]


async def test_the_engine_is_said_as_set_or_as_the_upstream_answers(http, sglang, stand_in, start, capture_dir, caplog):
    caplog.set_level(logging.INFO, logger="mcc")
    await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True, engine="sglang")
    said = [record.getMessage() for record in caplog.records if "token capture mode: the upstream" in record.getMessage()]
    assert said[0].startswith("token capture mode: the upstream is vLLM (GET /server_info answered 404")
    assert said[1] == "token capture mode: the upstream is SGLang (--engine)"


async def test_prefix_supply_is_off_on_sglang_and_each_turn_says_why(sglang, http, start, capture_dir, store, caplog):
    """SGLang takes no prompt ids for a chat call: with the token mode's defaults supply is off
    there, said once at start, and each turn that could have had a prefix says why."""
    with caplog.at_level("INFO", logger="mcc"):
        sidecar = await start(sglang.url, capture_dir=capture_dir, capture_tokens=True)
    assert [record.getMessage() for record in caplog.records if record.getMessage().startswith("prefix supply")] == [
        "prefix supply: off: SGLang takes no prompt ids for a chat call; turns go as the agent wrote them and each "
        "line says why (prefix_not_supplied: engine_sglang)"]
    messages: list = [SYSTEM, {"role": "user", "content": "hi"}]
    for turn in range(2):
        reply = await fetch(http, "POST", rollout_url(sidecar.url, "sg", "/v1/chat/completions"),
                            orjson.dumps({"model": "m", "messages": messages}), headers={"Content-Type": "application/json"})
        content = orjson.loads(reply.body)["choices"][0]["message"]["content"]
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"more {turn}"}]
    assert [line.get("prefix_not_supplied") for line in store.read("sg")] == [None, "engine_sglang"]
