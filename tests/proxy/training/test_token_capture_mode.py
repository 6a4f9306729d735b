"""The token capture mode on the stand-in (issue 20, docs/tokens.md): every dialect, whole and streamed,
raw clients and the official SDKs. The stand-in writes vLLM's keys (null where nothing is asked)
and derives its ids from what is generated, not from what is asked back, so a direct call and a
call through the sidecar in the mode must agree to the byte, ids included."""

from __future__ import annotations

import openai
import orjson
import pytest

from proxy import ConfigError, load_settings
from records import read_model_call_records, read_token_records

from tests.wire import Reply, fetch, rollout_url


def assert_same_reply(direct: Reply, proxied: Reply) -> None:
    """Status, headers and body identical; `Date` aside (the stand-in, an aiohttp server, writes
    one per reply, and the two calls may fall in different seconds)."""
    assert (proxied.status, proxied.reason) == (direct.status, direct.reason)
    undated = lambda headers: [(k, v) for k, v in headers if k.lower() != "date"]  # noqa: E731
    assert undated(proxied.headers) == undated(direct.headers)
    assert proxied.body == direct.body

_CHAT = {"model": "m", "messages": [{"role": "user", "content": "Say hello in a few words."}]}
_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
#: What agents send, none asking for token data: (path, body).
REQUESTS = {
    "chat": ("/v1/chat/completions", _CHAT),
    "chat-stream": ("/v1/chat/completions", {**_CHAT, "stream": True, "stream_options": {"include_usage": True}}),
    "chat-tools-stream": ("/v1/chat/completions", {**_CHAT, "tools": _TOOLS, "stream": True}),
    "completions": ("/v1/completions", {"model": "m", "prompt": "def add(a, b):"}),
    "completions-stream": ("/v1/completions", {"model": "m", "prompt": "def add(a, b):", "stream": True,
                                               "stream_options": {"include_usage": True}}),
    "completions-token-ids-n2-stream": ("/v1/completions", {"model": "m", "prompt": [11, 22, 33], "n": 2, "stream": True}),
    "responses": ("/v1/responses", {"model": "m", "input": "Say hello."}),
    "responses-stream": ("/v1/responses", {"model": "m", "input": "Say hello.", "stream": True}),
    "messages-stream": ("/v1/messages", {"model": "m", "max_tokens": 64, "stream": True,
                                         "messages": [{"role": "user", "content": "Say hello."}]}),
}
ADDED = {"/v1/chat/completions": {"logprobs": True, "return_token_ids": True, "return_weight_versions": True},
         "/v1/completions": {"logprobs": 0, "return_token_ids": True, "return_weight_versions": True},
         "/v1/responses": {"include": ["message.output_text.logprobs"], "enable_response_messages": True},
         "/v1/messages": None}


@pytest.mark.parametrize("case", list(REQUESTS))
async def test_the_agent_gets_the_bytes_of_its_own_request_and_the_line_gets_the_arrays(
        http, stand_in, start, capture_dir, store, case):
    path, request = REQUESTS[case]
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    body = orjson.dumps(request)
    direct = await fetch(http, "POST", stand_in.url + path, body)
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, case, path), body)
    assert_same_reply(direct, proxied)
    (line,) = store.read(case)
    assert line.get("added_request_fields") == ADDED[path]
    assert line["request"] == request
    if ADDED[path] is None:
        return
    records = read_token_records(store, case)
    assert len(records) == request.get("n", 1)
    for record in records:
        assert record.usable, record.unusable_reason
        assert len(record.generation_token_ids) == len(record.generation_log_probs) > 0
        if path == "/v1/completions" and isinstance(request["prompt"], list):
            assert record.prompt_token_ids == request["prompt"]


async def test_what_the_agent_asked_for_itself_is_left_alone(http, stand_in, start, capture_dir, store):
    """An agent that asks for logprobs (with top_logprobs) gets them as asked; only the ids are added and cut."""
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    body = orjson.dumps({**_CHAT, "stream": True, "logprobs": True, "top_logprobs": 2})
    direct = await fetch(http, "POST", stand_in.url + "/v1/chat/completions", body)
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "own", "/v1/chat/completions"), body)
    assert_same_reply(direct, proxied)
    assert b'"top_logprobs":[{' in proxied.body and b'"token_ids":null' in proxied.body
    (line,) = store.read("own")
    assert line["added_request_fields"] == {"return_token_ids": True, "return_weight_versions": True}
    (record,) = read_token_records(store, "own")
    assert record.usable


@pytest.mark.parametrize("stream", [False, True])
async def test_the_openai_sdk_sees_the_same_objects(stand_in, start, capture_dir, store, stream):
    """The official SDK, direct and through the mode, builds equal objects; chat and completions."""
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    direct = openai.AsyncOpenAI(base_url=stand_in.url + "/v1", api_key="k")
    proxied = openai.AsyncOpenAI(base_url=rollout_url(sidecar.url, "sdk", "/v1"), api_key="k")

    async def both(call):
        return [await call(client) for client in (direct, proxied)]

    async def chat(client):
        if not stream:
            return (await client.chat.completions.create(model="m", messages=_CHAT["messages"])).model_dump()
        return [chunk.model_dump() async for chunk in await client.chat.completions.create(
            model="m", messages=_CHAT["messages"], stream=True)]

    async def completion(client):
        if not stream:
            return (await client.completions.create(model="m", prompt="def add(a, b):")).model_dump()
        return [chunk.model_dump() async for chunk in await client.completions.create(
            model="m", prompt="def add(a, b):", stream=True)]

    for call in (chat, completion):
        mine, through = await both(call)
        assert mine == through
    records = read_model_call_records(store, "sdk")
    assert [record.dialect for record in records] == ["chat", "completions"]
    assert all(record.error_category is None and record.finish_reason for record in records)
    assert all(token.usable for token in read_token_records(store, "sdk"))


async def test_without_the_mode_nothing_is_added(http, stand_in, start, capture_dir, store):
    sidecar = await start(stand_in.url, capture_dir=capture_dir)
    await fetch(http, "POST", rollout_url(sidecar.url, "off", "/v1/chat/completions"), orjson.dumps(_CHAT))
    (line,) = store.read("off")
    assert "added_request_fields" not in line
    (record,) = read_token_records(store, "off")
    assert not record.usable and record.unusable_reason.startswith("missing ")


def test_the_setting_reads_from_flag_variable_and_yaml(tmp_path):
    on = {"upstream": "http://u", "capture_dir": str(tmp_path)}
    assert load_settings({**on, "capture_tokens": True}).capture_tokens is True
    assert load_settings(on, {"MCC_CAPTURE_TOKENS": "true"}).capture_tokens is True
    config = tmp_path / "c.yaml"
    config.write_text(f"mcc:\n  upstream: http://u\n  capture_dir: {tmp_path}\n  capture_tokens: true\n")
    assert load_settings({"config": str(config)}, {}).capture_tokens is True
    assert load_settings({"upstream": "http://u"}, {}).capture_tokens is False
    with pytest.raises(ConfigError, match="MCC_CAPTURE_TOKENS"):
        load_settings({"upstream": "http://u"}, {"MCC_CAPTURE_TOKENS": "sometimes"})
