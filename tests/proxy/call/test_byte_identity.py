"""Byte identity (docs/wire.md): a client receives through the sidecar exactly what it gets directly."""

from __future__ import annotations

import gzip
import random

import orjson
import pytest

from tests.scripted_upstream import Script, gzip_json_script, json_script, split_every, sse_script
from tests.transcripts import (
    CHAT_JSON,
    CHAT_JSON_REQUEST,
    CHAT_REQUEST,
    CHAT_STREAM,
    CONTEXT_LENGTH_ERROR,
    MESSAGES_REQUEST,
    MESSAGES_STREAM,
    SERVER_ERROR,
)
from tests.wire import assert_raw_until_the_end, assert_same_reply, fetch, rollout_url

CHAT = "/v1/chat/completions"


async def _compare(http, upstream, sidecar, path, script, body, rollout="r1", method="POST"):
    upstream.scripts[path.partition("?")[0]] = script
    direct = await fetch(http, method, upstream.url + path, body)
    proxied = await fetch(http, method, rollout_url(sidecar.url, rollout, path), body)
    assert_same_reply(direct, proxied)
    return direct, proxied


async def test_json_reply_is_identical_and_captured(http, upstream, sidecar, store):
    """A JSON reply arrives unchanged and its line holds the parsed request and response."""
    await _compare(http, upstream, sidecar, CHAT, json_script(CHAT_JSON), CHAT_JSON_REQUEST)
    (line,) = store.read("r1")
    assert line["request"] == orjson.loads(CHAT_JSON_REQUEST)
    assert line["response"] == orjson.loads(CHAT_JSON)
    assert (line["status_code"], line["error_category"], line["dialect"]) == (200, None, "chat")


async def test_sse_delivered_one_byte_at_a_time_is_identical(http, upstream, sidecar, store):
    """An SSE reply written one byte per chunk arrives unchanged and is still reassembled."""
    direct, proxied = await _compare(http, upstream, sidecar, CHAT, sse_script(CHAT_STREAM, split_every(CHAT_STREAM, 1)), CHAT_REQUEST)
    (line,) = store.read("r1")
    assert_raw_until_the_end(line["response_raw"], CHAT_STREAM)  # The request asked for usage.
    assert line["response"]["choices"][0]["message"]["content"] == "Hello \u2603"
    assert line["stream_truncated"] is False and line["error_category"] is None


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_sse_at_random_split_points_is_identical(http, upstream, sidecar, store, seed):
    """An SSE reply cut at seeded random points, even inside UTF-8 sequences, arrives unchanged."""
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(MESSAGES_STREAM)), 25))
    pieces = [MESSAGES_STREAM[a:b] for a, b in zip([0, *cuts], [*cuts, len(MESSAGES_STREAM)])]
    await _compare(http, upstream, sidecar, "/v1/messages", sse_script(MESSAGES_STREAM, pieces), MESSAGES_REQUEST)
    (line,) = store.read("r1")
    assert line["response"]["content"] == [{"type": "text", "text": "Hello"}]
    assert line["response"]["stop_reason"] == "end_turn"


async def test_gzip_reply_stays_gzip_and_the_capture_is_decoded(http, upstream, sidecar, store):
    """A gzip body reaches the client still compressed; only the capture copy is decoded."""
    direct, proxied = await _compare(http, upstream, sidecar, CHAT, gzip_json_script(CHAT_JSON), CHAT_JSON_REQUEST)
    assert proxied.header("Content-Encoding") == "gzip"
    assert gzip.decompress(proxied.body) == CHAT_JSON
    assert store.read("r1")[0]["response"] == orjson.loads(CHAT_JSON)


async def test_gzip_sse_stream_is_identical_and_reassembled(http, upstream, sidecar, store):
    """A gzip-encoded event stream stays gzip for the client and is decoded for the tap."""
    packed = gzip.compress(CHAT_STREAM, mtime=0)
    script = sse_script(packed, split_every(packed, 7))
    script.headers.append(("Content-Encoding", "gzip"))
    await _compare(http, upstream, sidecar, CHAT, script, CHAT_REQUEST)
    (line,) = store.read("r1")
    assert_raw_until_the_end(line["response_raw"], CHAT_STREAM)  # The request asked for usage.
    assert line["response"]["usage"]["prompt_tokens"] == 9


@pytest.mark.parametrize("status,reason,body,category", [
    (400, "Bad Request", CONTEXT_LENGTH_ERROR, "context_length_exceeded"),
    (401, "Unauthorized", b'{"error": {"message": "bad key"}}', "auth"),
    (404, "Not Found", b'{"error": {"message": "no such model"}}', "not_found"),
    (422, "Unprocessable Entity", b'{"detail": "bad"}', "client_error"),
    (429, "Too Many Requests", b'{"error": {"message": "slow down"}}', "rate_limit"),
    (500, "Internal Server Error", SERVER_ERROR, "upstream_error"),
    (503, "Service Unavailable", b"upstream overloaded", "upstream_error"),
    (504, "Gateway Timeout", b"", "timeout"),
])
async def test_error_replies_are_identical_and_categorised(http, upstream, sidecar, store, status, reason, body, category):
    """4xx and 5xx replies pass unchanged; the line says the status and the docs/files.md category."""
    await _compare(http, upstream, sidecar, CHAT, json_script(body, status, reason), CHAT_JSON_REQUEST)
    (line,) = store.read("r1")
    assert (line["status_code"], line["upstream_status_code"], line["error_category"]) == (status, status, category)
    assert line["response_source"] == "upstream"


async def test_non_observed_prefixed_path_is_forwarded_but_not_captured(http, upstream, sidecar, store):
    """GET /v1/models under the prefix is forwarded unchanged with the prefix stripped, and not captured."""
    models = b'{"object": "list", "data": [{"id": "m"}]}'
    await _compare(http, upstream, sidecar, "/v1/models?limit=5", json_script(models), None, method="GET")
    assert upstream.received[-1].target == "/v1/models?limit=5"
    assert store.rollout_ids() == []


async def test_unprefixed_call_is_forwarded_unchanged_and_not_captured(http, upstream, sidecar, store):
    """A call without the rollout prefix reaches the upstream as it was and writes nothing."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    direct = await fetch(http, "POST", upstream.url + CHAT + "?x=%2F", CHAT_JSON_REQUEST)
    proxied = await fetch(http, "POST", sidecar.url + CHAT + "?x=%2F", CHAT_JSON_REQUEST)
    assert_same_reply(direct, proxied)
    assert upstream.received[-1].target == CHAT + "?x=%2F"
    assert store.rollout_ids() == []


async def test_sidecar_adds_no_header_the_upstream_did_not_send(http, upstream, sidecar):
    """No Date, Server or Content-Type appears unless the upstream sent it."""
    script = Script(headers=[("Content-Length", "5")], pieces=[b"hello"])
    direct, proxied = await _compare(http, upstream, sidecar, CHAT, script, CHAT_JSON_REQUEST)
    assert proxied.headers == [("Content-Length", "5")]


async def test_repeated_and_mixed_case_headers_keep_order_and_case(http, upstream, sidecar):
    """Set-Cookie twice, odd header case and order all survive."""
    script = json_script(CHAT_JSON)
    script.headers += [("set-cookie", "a=1"), ("X-MiXeD", "v"), ("Set-Cookie", "b=2")]
    _, proxied = await _compare(http, upstream, sidecar, CHAT, script, CHAT_JSON_REQUEST)
    assert ("X-MiXeD", "v") in proxied.headers


async def test_request_reaches_upstream_unchanged_except_hop_by_hop(http, upstream, sidecar):
    """The upstream receives the client's body byte for byte and its end-to-end headers; Host is the upstream's."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    body = b'{"model": "m",   "messages": []}'
    await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), body,
                {"Authorization": "Bearer secret", "X-Custom": "1", "Connection": "keep-alive, X-Drop", "X-Drop": "x",
                 "Content-Type": "application/json"})
    received = upstream.received[-1]
    assert received.body == body
    assert received.header("Authorization") == "Bearer secret" and received.header("X-Custom") == "1"
    assert received.header("X-Drop") is None
    assert received.header("Host") == upstream.url.removeprefix("http://")


async def test_upstream_connections_are_reused(http, upstream, sidecar):
    """Sequential calls, JSON and streamed, share one kept-alive upstream connection."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    upstream.scripts["/v1/messages"] = sse_script(MESSAGES_STREAM)
    for _ in range(5):
        await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_JSON_REQUEST)
        await fetch(http, "POST", rollout_url(sidecar.url, "r1", "/v1/messages"), MESSAGES_REQUEST)
    assert upstream.connections == 1
