"""Acknowledged implies durable (docs/wire.md): when a client has the end of a reply, its line is on disk.

Each upstream here keeps its connection open for a while after the reply's end, so a sidecar that
wrote the line only when the upstream finished would be caught: the client already has the end.
"""

from __future__ import annotations

import aiohttp
import pytest

from tests.scripted_upstream import Script, json_script, split_every, sse_script
from tests.transcripts import CHAT_JSON, CHAT_JSON_REQUEST, CHAT_REQUEST, CHAT_STREAM, CHAT_TERMINAL, MESSAGES_REQUEST, MESSAGES_STREAM
from tests.wire import rollout_url

HANG_S = 1.5


async def _read_until(response: aiohttp.ClientResponse, marker: bytes) -> bytes:
    received = b""
    while marker not in received:
        chunk = await response.content.readany()
        assert chunk, "the stream ended before the marker arrived"
        received += chunk
    return received


async def test_stream_line_is_durable_when_the_terminal_event_arrives(http, upstream, sidecar, store):
    """The chat line is in the file the moment the client reads `data: [DONE]`, while the upstream still hangs."""
    upstream.scripts["/v1/chat/completions"] = sse_script(CHAT_STREAM, split_every(CHAT_STREAM, 40), ending="hang", hang_for=HANG_S)
    async with http.post(rollout_url(sidecar.url, "r1", "/v1/chat/completions"), data=CHAT_REQUEST) as response:
        await _read_until(response, CHAT_TERMINAL)
        lines = store.read("r1")
        assert len(lines) == 1 and lines[0]["stream_truncated"] is False
        # The request asked for usage: the line was made at the usage chunk (issue 55), its raw
        # text is the stream as read until then.
        assert CHAT_STREAM.decode().startswith(lines[0]["response_raw"]) and '"usage"' in lines[0]["response_raw"]


async def test_messages_line_is_durable_when_message_stop_arrives(http, upstream, sidecar, store):
    """The Anthropic line is durable when the client sees `message_stop`."""
    upstream.scripts["/v1/messages"] = sse_script(MESSAGES_STREAM, split_every(MESSAGES_STREAM, 33), ending="hang", hang_for=HANG_S)
    async with http.post(rollout_url(sidecar.url, "r1", "/v1/messages"), data=MESSAGES_REQUEST) as response:
        await _read_until(response, b'data: {"type":"message_stop"}\n\n')
        assert [line["error_category"] for line in store.read("r1")] == [None]


@pytest.mark.slow
async def test_chunked_json_line_is_durable_before_its_last_bytes_reach_the_client(http, upstream, sidecar, store):
    """A chunked JSON body of unknown length: the client gets its last bytes only after the line is written."""
    script = Script(headers=[("Content-Type", "application/json")], pieces=split_every(CHAT_JSON, 50), chunked=True,
                    ending="hang", hang_for=HANG_S)
    upstream.scripts["/v1/chat/completions"] = script
    async with http.post(rollout_url(sidecar.url, "r1", "/v1/chat/completions"), data=CHAT_JSON_REQUEST) as response:
        await _read_until(response, CHAT_JSON[-20:])
        assert len(store.read("r1")) == 1


async def test_sized_json_line_is_durable_before_its_last_bytes_reach_the_client(http, upstream, sidecar, store):
    """A Content-Length body: the line is written before the chunk that completes it is released."""
    script = json_script(CHAT_JSON)
    script.pieces = split_every(CHAT_JSON, 64)
    script.ending = "hang"
    script.hang_for = HANG_S
    upstream.scripts["/v1/chat/completions"] = script
    async with http.post(rollout_url(sidecar.url, "r1", "/v1/chat/completions"), data=CHAT_JSON_REQUEST) as response:
        await _read_until(response, CHAT_JSON[-20:])
        assert len(store.read("r1")) == 1


import orjson  # noqa: E402

from tests.transcripts import RESPONSES_REQUEST, RESPONSES_STREAM  # noqa: E402

_WHOLE = {"chat": ("/v1/chat/completions", CHAT_REQUEST, CHAT_STREAM, CHAT_TERMINAL),
          "responses": ("/v1/responses", RESPONSES_REQUEST, RESPONSES_STREAM, b"response.completed"),
          "messages": ("/v1/messages", MESSAGES_REQUEST, MESSAGES_STREAM, b"message_stop")}


@pytest.mark.parametrize("token_mode", [False, True])
@pytest.mark.parametrize("dialect", sorted(_WHOLE))
async def test_a_whole_stream_in_one_read_is_relayed_first_and_its_terminal_held(http, upstream, start, capture_dir,
                                                                                  store, dialect, token_mode):
    """Issue 34: a stream that arrives in one read has its events before the terminal relayed
    before they are parsed; the terminal still waits for the line (durable when the client sees it),
    and the client's bytes are the upstream's."""
    path, request, stream, terminal = _WHOLE[dialect]
    upstream.scripts[path] = sse_script(stream, [stream], ending="hang", hang_for=HANG_S)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=token_mode)
    async with http.post(rollout_url(sidecar.url, "whole", path), data=request) as response:
        received = await _read_until(response, terminal)
        lines = store.read("whole")
        assert len(lines) == 1 and lines[0]["stream_truncated"] is False and lines[0]["response"], lines
    assert stream.startswith(received) or received == stream


# -- Issue 55: durable before the agent's end, by the reply's own end ----------------------------

_USAGE_EVENT_AT = CHAT_STREAM.index(b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,'
                                    b'"model":"m","choices":[],"usage"')
_USAGE_EVENT_END = CHAT_STREAM.index(b"\n\n", _USAGE_EVENT_AT) + 2
#: How long the upstream waits before `[DONE]`, after the usage chunk.
DONE_AFTER_S = 0.4


@pytest.mark.parametrize("token_mode", [False, True])
@pytest.mark.parametrize("split", sorted({_USAGE_EVENT_AT - 7, _USAGE_EVENT_AT - 1, _USAGE_EVENT_AT, _USAGE_EVENT_AT + 1,
                                          _USAGE_EVENT_AT + 40, _USAGE_EVENT_END - 2, _USAGE_EVENT_END - 1,
                                          _USAGE_EVENT_END}))
async def test_a_reply_is_durable_at_its_last_meaningful_event_not_at_done(http, upstream, start, capture_dir, store,
                                                                          split, token_mode):
    """A request that asked for usage: its reply is whole at the usage chunk (every choice has its
    finish reason). An upstream that sends `[DONE]` 0.4 s later and a client that reads to the
    usage chunk and leaves (Codex CLI on chat): when the client has the usage chunk, its line is
    on disk -- whatever the reads around that event -- and `[DONE]` has not come yet."""
    pieces = [CHAT_STREAM[:split], CHAT_STREAM[split:_USAGE_EVENT_END], CHAT_STREAM[_USAGE_EVENT_END:]]
    pieces = [piece for piece in pieces[:2] if piece] + [pieces[2]]
    script = sse_script(CHAT_STREAM, pieces, pause=0.05)
    script.pauses = {len(pieces) - 1: DONE_AFTER_S}
    upstream.scripts["/v1/chat/completions"] = script
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=token_mode)
    async with http.post(rollout_url(sidecar.url, "whole-at-usage", "/v1/chat/completions"), data=CHAT_REQUEST) as response:
        received = await _read_until(response, CHAT_STREAM[_USAGE_EVENT_END - 30:_USAGE_EVENT_END])
        lines = store.read("whole-at-usage")
        assert CHAT_TERMINAL not in received, "the test must look before [DONE] comes"
        assert len(lines) == 1, "the client has the reply's last meaningful event: its line must be durable"
        line = lines[0]
        assert line["error_category"] is None and line["stream_truncated"] is False
        assert line["response"]["usage"]["total_tokens"] == 12
        assert line["response"]["choices"][0]["message"]["content"] == "Hello \u2603"
        rest = await response.read()
    assert received + rest == CHAT_STREAM, "the client's bytes are the upstream's"
    assert len(store.read("whole-at-usage")) == 1


@pytest.mark.parametrize("dialect", ["chat", "messages"])
async def test_a_reply_whose_end_is_not_known_early_still_ends_at_its_terminal(http, upstream, start, capture_dir, store, dialect):
    """Without ``include_usage`` a server may add a usage chunk after the finish (vLLM's
    --enable-force-include-usage), so a chat reply ends at `[DONE]` and the line keeps that usage;
    a Messages reply ends at `message_delta` (only `message_stop` follows)."""
    if dialect == "chat":
        path, request, stream = "/v1/chat/completions", orjson.dumps({"model": "m", "messages": [], "stream": True}), CHAT_STREAM
        late = stream.index(b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[],"usage"')
    else:
        path, request, stream = "/v1/messages", MESSAGES_REQUEST, MESSAGES_STREAM
        late = stream.index(b"event: message_stop")
    script = sse_script(stream, [stream[:late], stream[late:]])
    script.pauses = {1: DONE_AFTER_S}
    upstream.scripts[path] = script
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    async with http.post(rollout_url(sidecar.url, "late", path), data=request) as response:
        received = await _read_until(response, stream[late - 20:late])
        held_until_done = len(store.read("late")) == 0
        rest = await response.read()
    assert received + rest == stream
    (line,) = store.read("late")
    if dialect == "chat":
        assert held_until_done, "the reply was not known whole: its line waits for [DONE]"
        assert line["response"]["usage"]["total_tokens"] == 12, "the usage chunk nobody asked for is kept"
    else:
        assert not held_until_done, "message_delta ends a Messages reply: the line is durable before message_stop"
        assert line["response"]["stop_reason"] is not None and line["stream_truncated"] is False
