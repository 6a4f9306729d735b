"""`/-/metrics` counts known traffic exactly; logs are one line per problem, as text or JSON (issue 7)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.error
import urllib.request

import orjson
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import free_port

from tests.capture_dirs import remove_live_capture_dir
from tests.processes import read_line
from tests.scripted_upstream import json_script, sse_script
from tests.transcripts import CHAT_JSON, CHAT_JSON_REQUEST, CHAT_REQUEST, CHAT_STREAM
from tests.wire import fetch, rollout_url

CHAT = "/v1/chat/completions"


async def scrape(http, sidecar) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reply = await fetch(http, "GET", sidecar.url + "/-/metrics")
    assert reply.status == 200 and reply.header("Content-Type").startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_counters_move_by_exactly_the_traffic_sent(http, upstream, sidecar, capture_dir):
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    upstream.scripts["/v1/responses"] = sse_script(CHAT_STREAM.split(b"data: [DONE]")[0])  # no terminal: truncated
    upstream.scripts["/v1/models"] = json_script(b"{}")
    for _ in range(3):
        await fetch(http, "POST", rollout_url(sidecar.url, "m1", CHAT), CHAT_JSON_REQUEST)
    await fetch(http, "POST", rollout_url(sidecar.url, "m1", "/v1/responses"), CHAT_REQUEST)
    await fetch(http, "GET", sidecar.url + "/v1/models")
    await fetch(http, "POST", sidecar.url + "/ng-rollout/%2e%2e/v1/messages", CHAT_JSON_REQUEST)
    samples = await scrape(http, sidecar)
    assert value(samples, "mcc_requests_total", dialect="chat", status_class="2xx", captured="true") == 3
    assert value(samples, "mcc_requests_total", dialect="responses", status_class="2xx", captured="true") == 1
    assert value(samples, "mcc_requests_total", dialect="none", status_class="2xx", captured="false") == 1
    assert value(samples, "mcc_requests_total", dialect="none", status_class="4xx", captured="false") == 1
    assert value(samples, "mcc_capture_lines_written_total") == 4
    written = os.path.getsize(os.path.join(capture_dir, "m1.capture.jsonl"))
    assert value(samples, "mcc_capture_bytes_written_total") == written
    assert value(samples, "mcc_capture_fsync_duration_seconds_count") == 4
    assert value(samples, "mcc_terminal_chunk_holdback_seconds_count") == 4
    assert value(samples, "mcc_request_duration_seconds_count", dialect="chat") == 3
    assert value(samples, "mcc_time_to_first_token_seconds_count", dialect="responses") == 1
    assert value(samples, "mcc_streams_truncated_total") == 1
    assert value(samples, "mcc_requests_in_flight") == 0 and value(samples, "mcc_streams_in_flight") == 0


async def test_failures_are_counted_by_kind(http, upstream, start, capture_dir):
    refused = await start(f"http://127.0.0.1:{free_port()}", capture_dir=capture_dir)
    await fetch(http, "POST", rollout_url(refused.url, "f1", CHAT), CHAT_JSON_REQUEST)
    samples = await scrape(http, refused)
    assert value(samples, "mcc_upstream_errors_total", kind="connect") == 1
    assert value(samples, "mcc_requests_total", dialect="chat", status_class="5xx", captured="true") == 1

    sidecar = await start(upstream.url, capture_dir=capture_dir)
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    remove_live_capture_dir(capture_dir)
    await fetch(http, "POST", rollout_url(sidecar.url, "f2", CHAT), CHAT_JSON_REQUEST)
    os.mkdir(capture_dir)
    assert value(await scrape(http, sidecar), "mcc_capture_failures_total", kind="ENOENT") == 1


async def test_client_disconnects_are_counted(http, upstream, sidecar):
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM[:100], ending="hang", hang_for=5)
    response = await http.post(rollout_url(sidecar.url, "d1", CHAT), data=CHAT_REQUEST)
    await response.content.readexactly(100)
    response.close()
    for _ in range(100):
        if value(await scrape(http, sidecar), "mcc_client_disconnects_total") == 1:
            break
        await asyncio.sleep(0.02)
    assert value(await scrape(http, sidecar), "mcc_client_disconnects_total") == 1


def test_json_logs_are_one_object_per_line(tmp_path):
    """`--log-format json`: the refused upstream is reported in one JSON line."""
    process = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", "0", "--log-format", "json",
                                "--upstream", f"http://127.0.0.1:{free_port()}", "--capture-dir", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = orjson.loads(read_line(process.stdout))
        assert ready["message"] == f"listening on {ready['url']}" and ready["level"] == "info"
        url = ready["url"]
        request = urllib.request.Request(url + "/ng-rollout/j1/v1/chat/completions", data=CHAT_JSON_REQUEST, method="POST")
        try:
            urllib.request.urlopen(request, timeout=30)
        except urllib.error.HTTPError as error:
            assert error.code == 502
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=30)
    entries = [orjson.loads(line) for line in stderr.splitlines() if line.strip()]
    problems = [entry for entry in entries if entry["level"] == "warning"]
    assert len(problems) == 1 and "failed before replying" in problems[0]["message"]
    assert any(entry["message"].startswith("forwarding to ") for entry in entries), "the startup line is JSON too"
    assert {"time", "level", "logger", "message"} <= set(problems[0])


async def test_the_hold_back_counts_every_call_whose_end_waits_for_its_line(http, stand_in, start, capture_dir):
    """Issue 73, point 7: the token mode's whole replies (read whole, cut, then sent after their line)
    are held as a stream's last chunk is, and counted with them."""
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for body in (chat, chat, {**chat, "stream": True}):
        reply = await fetch(http, "POST", rollout_url(sidecar.url, "held", CHAT), orjson.dumps(body))
        assert reply.status == 200
    samples = await scrape(http, sidecar)
    assert value(samples, "mcc_terminal_chunk_holdback_seconds_count") == 3
