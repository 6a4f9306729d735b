"""Admin endpoints (docs/wire.md) and capture failures that must never hurt a call (docs/guarantees.md)."""

from __future__ import annotations

import logging
import os

import orjson
import pytest

from capture import REASSEMBLERS, ChatReassembler
from proxy.app import free_port

from tests.capture_dirs import remove_live_capture_dir
from tests.scripted_upstream import json_script, split_every, sse_script
from tests.proxy.app.test_metrics_and_logs import scrape, value
from tests.transcripts import CHAT_JSON, CHAT_JSON_REQUEST, CHAT_REQUEST, CHAT_STREAM
from tests.wire import assert_same_reply, fetch, rollout_url

CHAT = "/v1/chat/completions"


async def test_healthy_and_ready_when_all_is_well(http, sidecar, upstream):
    assert (await fetch(http, "GET", sidecar.url + "/-/healthy")).status == 200
    assert (await fetch(http, "GET", sidecar.url + "/-/health")).status == 200, "what people type: served, not forwarded"
    assert upstream.received == []
    ready = await fetch(http, "GET", sidecar.url + "/-/ready")
    assert ready.status == 200 and orjson.loads(ready.body)["capture_dir_writable"] is True


async def test_not_ready_when_the_upstream_is_down(http, start):
    sidecar = await start(f"http://127.0.0.1:{free_port()}")
    ready = await fetch(http, "GET", sidecar.url + "/-/ready")
    assert ready.status == 503 and orjson.loads(ready.body)["upstream_reachable"] is False


async def test_still_ready_when_the_capture_dir_is_gone_or_read_only(http, upstream, sidecar, capture_dir, caplog):
    """Readiness means "can forward": a capture fault shows in the body, the metrics and the log,
    never in the status (a 503 would take the pod out of its Service: every call would fail)."""
    def gauge(exposition: bytes) -> bytes:
        return next(line for line in exposition.splitlines() if line.startswith(b"mcc_capture_dir_writable "))
    assert gauge((await fetch(http, "GET", sidecar.url + "/-/metrics")).body).endswith(b" 1.0")
    os.chmod(capture_dir, 0o555)
    try:
        with caplog.at_level(logging.WARNING, logger="mcc"):
            ready = await fetch(http, "GET", sidecar.url + "/-/ready")
            again = await fetch(http, "GET", sidecar.url + "/-/ready")
        body = orjson.loads(ready.body)
        if os.geteuid() != 0:  # root writes anywhere: only the removed directory shows it then.
            assert body["capture_dir_writable"] is False and body["capture"] == "failing"
    finally:
        os.chmod(capture_dir, 0o755)
    assert ready.status == again.status == 200 and body["status"] == "ready"
    remove_live_capture_dir(capture_dir)
    with caplog.at_level(logging.WARNING, logger="mcc"):
        gone = await fetch(http, "GET", sidecar.url + "/-/ready")
    assert gone.status == 200 and orjson.loads(gone.body)["capture"] == "failing"
    assert gauge((await fetch(http, "GET", sidecar.url + "/-/metrics")).body).endswith(b" 0.0")
    assert sum("is not writable" in r.getMessage() for r in caplog.records) == 1, "said once, not per probe"


async def test_admin_paths_under_the_rollout_prefix_are_forwarded(http, upstream, sidecar):
    """`/-/` belongs to the sidecar only at the root; vLLM's own /health stays reachable."""
    upstream.scripts["/health"] = json_script(b"{}")
    reply = await fetch(http, "GET", rollout_url(sidecar.url, "r1", "/health"))
    assert reply.status == 200 and upstream.received[-1].target == "/health"


async def test_removed_capture_dir_never_changes_the_reply_and_capture_resumes(http, upstream, sidecar, capture_dir, store, caplog):
    """With the directory gone calls still get the upstream's bytes; one log line; capture resumes when it is back."""
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM)
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_REQUEST)
    remove_live_capture_dir(capture_dir)
    with caplog.at_level(logging.ERROR, logger="mcc.capture"):
        for _ in range(3):
            assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_REQUEST))
    assert len([r for r in caplog.records if "capture failed for rollout r1" in r.getMessage()]) == 1
    os.mkdir(capture_dir)
    assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_REQUEST))
    assert len(store.read("r1")) == 1


async def test_unwritable_capture_file_marks_the_rollout_incomplete(http, upstream, sidecar, capture_dir, store):
    """When the line cannot be appended the reply is unchanged and `.capture.incomplete` appears."""
    os.mkdir(os.path.join(capture_dir, "r1.capture.jsonl"))  # Appending to a directory fails (EISDIR).
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_JSON_REQUEST)
    assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_JSON_REQUEST))
    assert store.is_incomplete("r1")


class _BuggyChatReassembler(ChatReassembler):
    """A stand-in for a reassembler bug: it raises on the third event."""

    def _on_payload(self, event_type, payload):
        self.seen = getattr(self, "seen", 0) + 1
        if self.seen == 3:
            raise RuntimeError("reassembler bug")
        super()._on_payload(event_type, payload)


async def test_reassembler_bug_never_reaches_the_client(http, upstream, sidecar, store, monkeypatch):
    """A bug in a reassembler: identical bytes for the client; line `capture_parse_error` with all raw text."""
    monkeypatch.setitem(REASSEMBLERS, "chat", _BuggyChatReassembler)
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM, split_every(CHAT_STREAM, 30))
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_REQUEST)
    assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_REQUEST))
    (line,) = store.read("r1")
    assert line["error_category"] == "capture_parse_error" and line["response"] is None
    assert line["response_raw"] == CHAT_STREAM.decode()
    assert line["failure"]["stage"] == "capture" and "reassembler bug" in line["failure"]["message"]


async def test_a_call_without_the_rollout_prefix_is_said_once_then_counted(http, upstream, sidecar, store, caplog):
    """Issue 21, point 4: with capture on, an agent pointed at the bare URL would lose every call
    in silence. The first is logged with the base_url to use; every one is counted."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    with caplog.at_level(logging.WARNING, logger="mcc.proxy"):
        for _ in range(3):
            direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_JSON_REQUEST)
            assert_same_reply(direct, await fetch(http, "POST", sidecar.url + CHAT, CHAT_JSON_REQUEST))
        await fetch(http, "GET", sidecar.url + "/v1/models")  # Not a model call: not counted.
    said = [r.getMessage() for r in caplog.records if "NOT captured" in r.getMessage()]
    assert len(said) == 1 and f"{sidecar.url}/ng-rollout/<rollout_id>/v1" in said[0]
    assert value(await scrape(http, sidecar), "mcc_uncaptured_calls_total") == 3
    assert store.rollout_ids() == []


async def test_the_stand_in_takes_the_bodies_the_sidecar_takes(http, stand_in, start, capture_dir):
    """A 2 MiB prompt (over aiohttp's 1 MiB default) passes the sidecar and is served by the stand-in."""
    sidecar = await start(stand_in.url, capture_dir=capture_dir)
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (2 << 20)}]})
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "big", CHAT), body)
    assert reply.status == 200, reply.body[:200]


async def test_the_stand_ins_messages_reply_thinks_only_when_asked(http, stand_in):
    """As Anthropic answers: a thinking block first only with ``thinking`` enabled, so a plain
    request's ``content[0].text`` is the answer (the quickstart idiom); its usage counts what it says."""
    url = f"{stand_in.url}/v1/messages"
    plain = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    thinking = {**plain, "thinking": {"type": "enabled", "budget_tokens": 1024}}
    answered = orjson.loads((await fetch(http, "POST", url, orjson.dumps(plain))).body)
    thought = orjson.loads((await fetch(http, "POST", url, orjson.dumps(thinking))).body)
    assert [block["type"] for block in answered["content"]] == ["text"]
    assert [block["type"] for block in thought["content"]] == ["thinking", "text"]
    assert answered["content"][0]["text"] == thought["content"][1]["text"]
    assert answered["usage"]["output_tokens"] < thought["usage"]["output_tokens"]
    streamed = (await fetch(http, "POST", url, orjson.dumps({**plain, "stream": True}))).body
    assert b'"thinking"' not in streamed and b'"text_delta"' in streamed


@pytest.mark.parametrize("forward", ["all", "model-api"])
async def test_an_admin_path_that_does_not_exist_is_a_404_naming_the_endpoints_never_forwarded(http, upstream, start,
                                                                                           capture_dir, forward):
    """In every forward mode (issue 73, point 7: under ``--forward all`` an unknown ``/-/`` path had
    reached the upstream)."""
    sidecar = await start(upstream.url, capture_dir=capture_dir, forward=forward)
    for method, path, status in (("POST", "/-/rollout/r1/end", 404), ("GET", "/-/rollouts", 404),
                                 ("GET", "/-/consumers/trainer", 404), ("POST", "/-/ready", 405)):
        reply = await fetch(http, method, sidecar.url + path, b"{}" if method == "POST" else None)
        assert reply.status == status, (path, reply.body)
        said = orjson.loads(reply.body)
        assert "POST /-/rollouts/<rollout_id>/end" in said["paths"] and "never forwarded" in said["error"]
    assert upstream.received == [], "/-/ is the sidecar's own: never forwarded"
