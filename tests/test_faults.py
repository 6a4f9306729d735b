"""Upstream and client faults (issue 2, point 6): the right status for the client, the right line on disk."""

from __future__ import annotations

import asyncio

import orjson

from proxy.app import free_port

from .scripted_upstream import Script, split_every, sse_script
from .transcripts import CHAT_JSON_REQUEST, CHAT_REQUEST, CHAT_STREAM, MESSAGES_REQUEST
from .wire import fetch, rollout_url

CHAT = "/v1/chat/completions"


async def test_refused_upstream_gets_a_local_502_in_openai_shape(http, start, capture_dir, store):
    """Nothing listens upstream: a local 502 with an OpenAI error body, line category `connection`."""
    sidecar = await start(f"http://127.0.0.1:{free_port()}", capture_dir=capture_dir)
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_JSON_REQUEST)
    assert reply.status == 502
    assert orjson.loads(reply.body)["error"]["code"] == "upstream_unreachable"
    assert reply.header("x-mcc-local-response") == "upstream_unreachable"
    (line,) = store.read("r1")
    assert (line["status_code"], line["error_category"], line["response_source"]) == (502, "connection", "local")
    assert line["upstream_status_code"] is None and line["upstream_attempted"] is True
    assert line["local_response_reason"] == "upstream_unreachable"
    assert line["failure"]["stage"] == "upstream_connect" and line["failure"]["retryable"] is True


async def test_refused_upstream_on_messages_path_answers_in_anthropic_shape(http, start, capture_dir, store):
    """The local error on /v1/messages has Anthropic's `{"type": "error", ...}` shape."""
    sidecar = await start(f"http://127.0.0.1:{free_port()}", capture_dir=capture_dir)
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "r1", "/v1/messages"), MESSAGES_REQUEST)
    body = orjson.loads(reply.body)
    assert reply.status == 502 and body["type"] == "error" and body["error"]["type"] == "api_error"
    assert store.read("r1")[0]["dialect"] == "messages"


async def test_read_timeout_gets_a_local_504(http, upstream, start, capture_dir, store):
    """The upstream accepts but never answers within the read timeout: local 504, category `timeout`."""
    upstream.scripts[CHAT] = Script(delay_head=5)
    sidecar = await start(upstream.url, capture_dir=capture_dir, read_timeout=0.3)
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_JSON_REQUEST)
    assert reply.status == 504
    (line,) = store.read("r1")
    assert (line["error_category"], line["local_response_reason"]) == ("timeout", "upstream_timeout")


async def test_upstream_closing_mid_stream_marks_the_line_truncated(http, upstream, sidecar, store):
    """The upstream resets after half the stream: the client gets those bytes then an error; the line is truncated."""
    half = CHAT_STREAM[: len(CHAT_STREAM) // 2]
    upstream.scripts[CHAT] = sse_script(half, split_every(half, 50), ending="reset")
    received = b""
    failed = False
    async with http.post(rollout_url(sidecar.url, "r1", CHAT), data=CHAT_REQUEST) as response:
        try:
            async for chunk in response.content.iter_any():
                received += chunk
        except Exception:
            failed = True
    assert received == half and failed, "the client must see the upstream's failure, not a clean end"
    (line,) = store.read("r1")
    assert line["stream_truncated"] is True and line["error_category"] == "stream_truncated"
    assert line["response_raw"] == half.decode()
    assert line["response"]["choices"][0]["message"]["reasoning_content"].startswith("Think")


async def test_stream_ending_cleanly_without_terminal_is_truncated(http, upstream, sidecar, store):
    """A 2xx SSE reply that ends without its terminal event is `stream_truncated`, partial result kept."""
    cut = CHAT_STREAM.split(b"data: [DONE]")[0]
    upstream.scripts[CHAT] = sse_script(cut)
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_REQUEST)
    assert reply.body == cut
    (line,) = store.read("r1")
    assert line["error_category"] == "stream_truncated" and line["response"]["usage"]["total_tokens"] == 12


async def test_client_leaving_mid_stream_cancels_the_upstream_request(http, upstream, sidecar, store):
    """The client disconnects mid-stream: the upstream connection is closed (generation stops), line `cancelled`."""
    first = CHAT_STREAM[:120]
    upstream.scripts[CHAT] = sse_script(first, [first], ending="hang", hang_for=10)
    response = await http.post(rollout_url(sidecar.url, "r1", CHAT), data=CHAT_REQUEST)
    assert await response.content.readexactly(len(first)) == first
    response.close()
    for _ in range(200):
        if upstream.peer_gone and store.read("r1"):
            break
        await asyncio.sleep(0.02)
    assert upstream.peer_gone == [CHAT], "the upstream must see the sidecar hang up"
    (line,) = store.read("r1")
    assert line["error_category"] == "cancelled" and line["failure"]["stage"] == "client"
    assert line["status_code"] == 200


async def test_body_over_the_limit_gets_a_local_413_and_never_reaches_upstream(http, upstream, start, capture_dir, store):
    """A request body above --max-body-bytes: local 413, category `client_error`, nothing sent upstream."""
    sidecar = await start(upstream.url, capture_dir=capture_dir, max_body_bytes=1000)
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), b"{" + b" " * 2000 + b"}")
    assert reply.status == 413
    assert orjson.loads(reply.body)["error"]["code"] == "body_too_large"
    assert upstream.received == []
    (line,) = store.read("r1")
    assert (line["error_category"], line["local_response_reason"], line["upstream_attempted"]) == ("client_error", "body_too_large", False)


async def test_chunked_body_over_the_limit_is_refused_too(http, upstream, start, capture_dir):
    """A body without Content-Length is counted as it arrives and refused once past the limit."""
    sidecar = await start(upstream.url, capture_dir=capture_dir, max_body_bytes=1000)

    async def body():
        for _ in range(10):
            yield b" " * 500

    async with http.post(rollout_url(sidecar.url, "r1", CHAT), data=body()) as response:
        assert response.status == 413
    assert upstream.received == []


async def test_garbage_from_upstream_gets_a_local_502(http, upstream, sidecar, store):
    """An upstream that answers with bytes that are not HTTP: local 502, category `connection`."""
    upstream.scripts[CHAT] = Script(garbage=b"\x00\x01 this is not HTTP\r\n\r\n")
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_JSON_REQUEST)
    assert reply.status == 502
    assert store.read("r1")[0]["error_category"] == "connection"


async def test_upstream_error_event_inside_a_2xx_stream_is_upstream_error(http, upstream, sidecar, store):
    """vLLM's in-stream failure (`data: {"error": ...}`) makes the line `upstream_error`."""
    stream = CHAT_STREAM.split(b"data: {")[0] + b'data: {"error": {"message": "boom", "code": 500}}\n\ndata: [DONE]\n\n'
    upstream.scripts[CHAT] = sse_script(stream)
    await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_REQUEST)
    assert store.read("r1")[0]["error_category"] == "upstream_error"
