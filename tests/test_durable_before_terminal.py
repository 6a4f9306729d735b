"""Acknowledged implies durable (DESIGN §2): when a client has the end of a reply, its line is on disk.

Each upstream here keeps its connection open for a while after the reply's end, so a sidecar that
wrote the line only when the upstream finished would be caught: the client already has the end.
"""

from __future__ import annotations

import aiohttp

from .scripted_upstream import Script, json_script, split_every, sse_script
from .transcripts import CHAT_JSON, CHAT_JSON_REQUEST, CHAT_REQUEST, CHAT_STREAM, CHAT_TERMINAL, MESSAGES_REQUEST, MESSAGES_STREAM
from .wire import rollout_url

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
        assert lines[0]["response_raw"].endswith("data: [DONE]\n\n")


async def test_messages_line_is_durable_when_message_stop_arrives(http, upstream, sidecar, store):
    """The Anthropic line is durable when the client sees `message_stop`."""
    upstream.scripts["/v1/messages"] = sse_script(MESSAGES_STREAM, split_every(MESSAGES_STREAM, 33), ending="hang", hang_for=HANG_S)
    async with http.post(rollout_url(sidecar.url, "r1", "/v1/messages"), data=MESSAGES_REQUEST) as response:
        await _read_until(response, b'data: {"type":"message_stop"}\n\n')
        assert [line["error_category"] for line in store.read("r1")] == [None]


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


import pytest  # noqa: E402

from .transcripts import RESPONSES_REQUEST, RESPONSES_STREAM  # noqa: E402

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
