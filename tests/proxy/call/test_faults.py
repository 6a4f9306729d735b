"""Upstream and client faults (issue 2, point 6): the right status for the client, the right line on disk."""

from __future__ import annotations

import asyncio

import orjson

from proxy.app import free_port

from tests.scripted_upstream import Script, split_every, sse_script
from tests.transcripts import CHAT_JSON_REQUEST, CHAT_REQUEST, CHAT_STREAM, MESSAGES_REQUEST
from tests.wire import fetch, rollout_url

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
    """A 2xx SSE reply that ends without its terminal event is `stream_truncated`, partial result kept
    (a request without ``include_usage``: its reply ends at `[DONE]`, docs/wire.md)."""
    cut = CHAT_STREAM.split(b"data: [DONE]")[0]
    upstream.scripts[CHAT] = sse_script(cut)
    request = orjson.dumps({**orjson.loads(CHAT_REQUEST), "stream_options": {"include_usage": False}})
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), request)
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


def _chat_chunk(choices: list, usage=None) -> bytes:
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return b"data: " + orjson.dumps(body) + b"\n\n"


def _choice(index: int, text: str | None, finish: str | None = None) -> dict:
    return {"index": index, "delta": {"content": text} if text is not None else {}, "logprobs": None,
            "finish_reason": finish}


_USAGE = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}


async def _leave_before_done(http, upstream, sidecar, store, rollout: str, request: dict, events: list[bytes]) -> dict:
    """The upstream sends ``events`` and then waits before ``[DONE]``; the client reads them all and
    hangs up, as Codex CLI's chat wire does. The call's line."""
    body = b"".join(events)
    upstream.scripts[CHAT] = sse_script(body, [body], ending="hang", hang_for=10)
    response = await http.post(rollout_url(sidecar.url, rollout, CHAT), data=orjson.dumps(request))
    assert await response.content.readexactly(len(body)) == body, "the client gets the upstream's bytes"
    response.close()
    return await _line_once_written(store, rollout)


async def _line_once_written(store, rollout: str) -> dict:
    """The rollout's one line, once the sidecar has written it (after a client left)."""
    for _ in range(250):
        if store.read(rollout):
            break
        await asyncio.sleep(0.02)
    (line,) = store.read(rollout)
    return line


async def test_a_chat_stream_is_complete_at_its_finish_reasons_even_if_the_client_leaves_before_done(
        http, upstream, sidecar, store):
    """Every choice's finish reason (and the usage chunk, where the request asked it) is the end of
    the reply: a client leaving before ``[DONE]`` leaves a complete call, counted as such, not a
    cancel. A choice without its finish reason, or the usage asked for and not yet come: cancelled."""
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    whole = await _leave_before_done(http, upstream, sidecar, store, "whole", request, [
        _chat_chunk([_choice(0, "Hel")]), _chat_chunk([_choice(0, "lo", "stop")])])
    assert whole["error_category"] is None and "failure" not in whole and not whole.get("stream_truncated"), whole
    assert whole["response"]["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": "Hello"},
                                               "finish_reason": "stop", "logprobs": None}

    with_usage = {**request, "stream_options": {"include_usage": True}}
    waiting = await _leave_before_done(http, upstream, sidecar, store, "usage-missing", with_usage, [
        _chat_chunk([_choice(0, "Hi", "stop")])])
    assert waiting["error_category"] == "cancelled", "the usage chunk it asked for had not come"
    counted = await _leave_before_done(http, upstream, sidecar, store, "usage-came", with_usage, [
        _chat_chunk([_choice(0, "Hi", "stop")]), _chat_chunk([], _USAGE)])
    assert counted["error_category"] is None and counted["response"]["usage"] == _USAGE

    two = {**request, "n": 2}
    half = await _leave_before_done(http, upstream, sidecar, store, "n2-half", two, [
        _chat_chunk([_choice(0, "a", "stop")]), _chat_chunk([_choice(1, "b")])])
    assert half["error_category"] == "cancelled", "choice 1 had not finished"
    both = await _leave_before_done(http, upstream, sidecar, store, "n2-both", two, [
        _chat_chunk([_choice(0, "a", "stop")]), _chat_chunk([_choice(1, "b", "length")])])
    assert both["error_category"] is None and [c["finish_reason"] for c in both["response"]["choices"]] == ["stop", "length"]

    metrics = (await fetch(http, "GET", sidecar.url + "/-/metrics")).body.decode()
    assert "mcc_client_left_after_end_total 3.0" in metrics and "mcc_client_disconnects_total 2.0" in metrics


async def test_a_messages_stream_is_complete_at_its_stop_reason_even_if_the_client_leaves_before_message_stop(
        http, upstream, sidecar, store):
    """The same rule for Anthropic Messages: the ``message_delta`` with the stop reason is the
    last meaningful event; ``message_stop`` only follows."""
    path = "/v1/messages"

    def event(name: str, data: dict) -> bytes:
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    start = event("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1}}})
    text = (event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            + event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}})
            + event("content_block_stop", {"type": "content_block_stop", "index": 0}))
    stop = event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                   "usage": {"output_tokens": 2}})
    request = orjson.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "stream": True})
    for rollout, body, category in (("ended", start + text + stop, None), ("midway", start + text, "cancelled")):
        upstream.scripts[path] = sse_script(body, [body], ending="hang", hang_for=10)
        response = await http.post(rollout_url(sidecar.url, rollout, path), data=request)
        assert await response.content.readexactly(len(body)) == body
        response.close()
        line = await _line_once_written(store, rollout)
        assert line["error_category"] == category, line
    (ended,) = store.read("ended")
    assert ended["response"]["stop_reason"] == "end_turn" and ended["response"]["content"] == [{"type": "text", "text": "Hi"}]


async def _finish_chunk_then_line(http, upstream, sidecar, store, rollout: str, events: list[bytes], held: int) -> tuple[dict, dict]:
    """The upstream sends ``events``, waits 10 s, then ``[DONE]``; the client reads the first ``held``
    events (to the one that ends the reply) and, that moment, looks for the line: (the line then,
    or {} when it was not on disk; the line once the reply has ended)."""
    body = b"".join(events) + b"data: [DONE]\n\n"
    upstream.scripts[CHAT] = sse_script(body, [*events, b"data: [DONE]\n\n"], pauses={len(events): 10.0})
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    response = await http.post(rollout_url(sidecar.url, rollout, CHAT), data=orjson.dumps(request))
    read = await response.content.readexactly(len(b"".join(events[:held])))
    assert read == b"".join(events[:held]), "the client gets the upstream's bytes"
    lines = store.read(rollout)
    response.close()
    return (lines[0] if lines else {}), await _line_once_written(store, rollout)


async def test_a_chat_stream_that_asked_no_usage_is_durable_at_its_finish_chunk_once_the_upstream_is_known(
        http, upstream, start, capture_dir, store, caplog):
    """A request without ``include_usage``: the first whole stream shows whether the upstream adds
    a usage chunk anyway (vLLM's ``--enable-force-include-usage``). Where it does not, every later
    reply ends at its last finish reason: its line is on disk when the client has that chunk, with
    ``[DONE]`` ten seconds behind. Where it does, a reply ends at that usage chunk, which its line
    keeps. An upstream that starts adding one later is noticed, said, and waited for from then on."""
    finish = [_chat_chunk([_choice(0, "Hel")]), _chat_chunk([_choice(0, "lo", "stop")])]
    plain = await start(upstream.url, capture_dir=capture_dir)
    first, _ = await _finish_chunk_then_line(http, upstream, plain, store, "first", finish, held=2)
    assert first == {}, "not known yet: the reply ended at [DONE], as before"
    second, line = await _finish_chunk_then_line(http, upstream, plain, store, "second", finish, held=2)
    assert second == line and line["error_category"] is None and "usage" not in line["response"]
    assert line["response"]["choices"][0]["message"]["content"] == "Hello"

    forced = [*finish, _chat_chunk([], _USAGE)]
    changed, line = await _finish_chunk_then_line(http, upstream, plain, store, "changed", forced, held=3)
    assert "usage" not in line["response"], "its line was made at the finish reason, before the usage came"
    assert "the upstream sent a usage chunk that the request did not ask for" in caplog.text
    waits, line = await _finish_chunk_then_line(http, upstream, plain, store, "waits", forced, held=3)
    assert waits == line and line["response"]["usage"] == _USAGE, "later replies end at the usage chunk"

    adds = await start(upstream.url, capture_dir=capture_dir)
    first, line = await _finish_chunk_then_line(http, upstream, adds, store, "forced-first", forced, held=3)
    assert first == {} and line["response"]["usage"] == _USAGE
    second, line = await _finish_chunk_then_line(http, upstream, adds, store, "forced-second", forced, held=3)
    assert second == line and line["response"]["usage"] == _USAGE
