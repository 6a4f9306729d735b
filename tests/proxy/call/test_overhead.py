"""The sidecar's own time on a call, by part (docs/speed.md, "Overhead by part"): in
``mcc_call_overhead_seconds`` for every call, and in a ``Server-Timing`` header only where the
operator asked (``--overhead-header``): otherwise the agent's bytes are the upstream's."""

from __future__ import annotations

import re

import orjson
import pytest

from proxy import Settings

from tests.scripted_upstream import json_script, sse_script
from tests.transcripts import CHAT_REQUEST, CHAT_STREAM
from tests.wire import fetch, rollout_url

CHAT = "/v1/chat/completions"
REPLY = orjson.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "Hi ada@example.com"}, "finish_reason": "stop"}]})


def overhead_counts(metrics: str) -> dict[str, float]:
    """Each part's count of calls in the exposition."""
    return {part: float(count) for part, count in
            re.findall(r'^mcc_call_overhead_seconds_count\{part="([a-z_]+)"\} ([0-9.e+]+)$', metrics, flags=re.M)}


async def test_every_part_of_a_json_call_and_a_stream_is_in_the_metrics(http, upstream, start, capture_dir, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: email\n    pattern: '[a-z]+@example\\.com'\n")
    sidecar = await start(upstream.url, capture_dir=capture_dir, redact=str(rules))
    upstream.scripts[CHAT] = json_script(REPLY)
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_REQUEST)
    json_reply = await fetch(http, "POST", rollout_url(sidecar.url, "o1", CHAT), CHAT_REQUEST)
    assert json_reply.body == direct.body and json_reply.header("Server-Timing") is None
    counts = overhead_counts((await fetch(http, "GET", sidecar.url + "/-/metrics")).body.decode())
    assert counts == {"request": 1, "connect": 1, "head": 1, "parse": 1, "line": 1, "redaction": 1, "durable": 1}

    upstream.scripts[CHAT] = sse_script(CHAT_STREAM)
    stream = await fetch(http, "POST", rollout_url(sidecar.url, "o1", CHAT), CHAT_REQUEST)
    assert stream.body == CHAT_STREAM
    metrics = (await fetch(http, "GET", sidecar.url + "/-/metrics")).body.decode()
    counts = overhead_counts(metrics)
    assert counts == {"request": 2, "connect": 2, "head": 2, "first_byte": 1, "parse": 2, "line": 2, "redaction": 2,
                      "durable": 2}
    total = float(re.search(r'^mcc_call_overhead_seconds_sum\{part="durable"\} ([0-9.e+-]+)$', metrics, flags=re.M)[1])
    assert 0 < total < 60


async def test_the_server_timing_header_only_where_the_operator_asked(http, upstream, start, capture_dir):
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM)
    plain = await start(upstream.url, capture_dir=capture_dir)
    timed = await start(upstream.url, capture_dir=capture_dir, overhead_header=True)
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_REQUEST)
    assert direct.header("Server-Timing") is None
    as_came = await fetch(http, "POST", rollout_url(plain.url, "t1", CHAT), CHAT_REQUEST)
    assert as_came.header("Server-Timing") is None and as_came.body == direct.body
    reply = await fetch(http, "POST", rollout_url(timed.url, "t2", CHAT), CHAT_REQUEST)
    assert reply.body == direct.body
    timing = reply.header("Server-Timing")
    parts = dict(re.findall(r"([a-z-]+);dur=([0-9.]+)", timing))
    assert list(parts) == ["mcc-request", "mcc-connect", "mcc-head", "upstream"], timing
    assert all(0 <= float(value) < 60_000 for value in parts.values())
    other = [(name, value) for name, value in reply.headers if name.lower() != "server-timing"]
    assert other == as_came.headers, "nothing else of the head changes"


def test_the_header_without_capture_is_refused_in_one_sentence():
    with pytest.raises(ValueError, match="--overhead-header times captured calls, and capture is off"):
        Settings(upstream="http://127.0.0.1:9", overhead_header=True)
