"""The official SDKs get identical parsed results through the sidecar and directly (issue 2)."""

from __future__ import annotations

from typing import Any

import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI

from records import extract_token_stats

MODEL = "stand-in-1"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture
async def through(start, stand_in, capture_dir):
    """A sidecar in front of the stand-in model server, capturing."""
    return await start(stand_in.url, capture_dir=capture_dir)


def _openai(base: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base + "/v1", api_key="k", max_retries=0)


def _anthropic(base: str) -> AsyncAnthropic:
    return AsyncAnthropic(base_url=base, api_key="k", max_retries=0)


def _without_none(value: Any) -> Any:
    """SDK models dump unset optional fields as None; the wire JSON simply lacks them."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


async def _both(direct_base: str, proxied_base: str, call: Any) -> tuple[Any, Any]:
    return await call(direct_base), await call(proxied_base)


async def test_openai_chat_json_and_stream_are_identical(stand_in, through, store):
    """Chat Completions, whole and streamed (with usage), parse the same both ways."""
    async def whole(base: str) -> Any:
        async with _openai(base) as client:
            reply = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=TOOLS)
        return reply.model_dump()

    async def streamed(base: str) -> Any:
        async with _openai(base) as client:
            stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                          stream=True, stream_options={"include_usage": True})
            return [chunk.model_dump() async for chunk in stream]

    proxied_base = through.url + "/ng-rollout/sdk-chat"
    for call in (whole, streamed):
        direct, proxied = await _both(stand_in.url, proxied_base, call)
        assert direct == proxied
    lines = store.read("sdk-chat")
    assert [line["error_category"] for line in lines] == [None, None]
    assert lines[0]["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert extract_token_stats(lines[1]["response"]["usage"])["cached_tokens"] == 48


async def test_openai_responses_json_and_stream_are_identical(stand_in, through, store):
    """Responses, whole and streamed: same parsed objects; the captured stream equals the terminal response."""
    async def whole(base: str) -> Any:
        async with _openai(base) as client:
            return (await client.responses.create(model=MODEL, input="hi")).model_dump()

    async def streamed(base: str) -> Any:
        async with _openai(base) as client:
            stream = await client.responses.create(model=MODEL, input="hi", stream=True)
            return [event.model_dump() async for event in stream]

    proxied_base = through.url + "/ng-rollout/sdk-responses"
    for call in (whole, streamed):
        direct, proxied = await _both(stand_in.url, proxied_base, call)
        assert direct == proxied
    whole_line, stream_line = store.read("sdk-responses")
    assert _without_none(stream_line["response"]) == _without_none(proxied[-1]["response"])
    assert stream_line["latency_ttft_ms"] is not None and stream_line["stream_truncated"] is False


async def test_anthropic_messages_json_and_stream_are_identical(stand_in, through, store):
    """Messages, whole and via MessageStream: same final messages; the capture rebuilds the streamed one."""
    async def whole(base: str) -> Any:
        async with _anthropic(base) as client:
            return (await client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}])).model_dump()

    async def streamed(base: str) -> Any:
        async with _anthropic(base) as client:
            async with client.messages.stream(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as stream:
                return (await stream.get_final_message()).model_dump()

    proxied_base = through.url + "/ng-rollout/sdk-messages"
    for call in (whole, streamed):
        direct, proxied = await _both(stand_in.url, proxied_base, call)
        assert direct == proxied
    _, stream_line = store.read("sdk-messages")
    captured = stream_line["response"]
    assert _without_none(captured["content"]) == _without_none(proxied["content"])
    assert captured["usage"]["output_tokens"] == proxied["usage"]["output_tokens"]
    assert captured["stop_reason"] == proxied["stop_reason"] == "end_turn"
