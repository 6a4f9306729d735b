"""The file contract (docs/files.md): what goes on disk, where, and what never does."""

from __future__ import annotations

import asyncio
import os
import random

import orjson
import pytest

from records.contract.reading import CORE_KEYS

from tests.capture_dirs import rollout_files
from tests.scripted_upstream import json_script, split_every, sse_script
from tests.transcripts import CHAT_JSON, CHAT_JSON_REQUEST, RESPONSES_REQUEST, RESPONSES_STREAM
from tests.wire import fetch, rollout_url

CHAT = "/v1/chat/completions"


async def test_line_has_core_keys_first_in_contract_order(http, upstream, sidecar, capture_dir):
    """Core keys lead every line in the docs/files.md order; model_ref names the configured model."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    await fetch(http, "POST", rollout_url(sidecar.url, "run-1.a_b", CHAT), CHAT_JSON_REQUEST)
    with open(os.path.join(capture_dir, "run-1.a_b.capture.jsonl"), "rb") as handle:
        raw = handle.read()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    line = orjson.loads(raw)
    assert tuple(line)[: len(CORE_KEYS)] == CORE_KEYS
    assert line["model_ref"] == {"type": "responses_api_models", "name": "test-model"}
    assert len(line["model_call_id"]) == 32 and int(line["model_call_id"], 16) >= 0
    assert line["started_at"] <= line["completed_at"]
    assert 0 <= line["latency_ttft_ms"] <= line["latency_ms"]


async def test_secret_headers_never_reach_the_disk(http, upstream, sidecar, capture_dir):
    """Authorization, x-api-key, api-key and cookies are forwarded but never written."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    secrets = {"Authorization": "Bearer sk-SECRET1", "x-api-key": "SECRET2", "api-key": "SECRET3", "Cookie": "s=SECRET4"}
    await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_JSON_REQUEST, secrets)
    assert upstream.received[-1].header("x-api-key") == "SECRET2"
    for directory, _, names in os.walk(capture_dir):
        for name in names:
            with open(os.path.join(directory, name), "rb") as handle:
                assert b"SECRET" not in handle.read()


async def test_correlation_headers_are_recorded_only_when_unambiguous(http, upstream, sidecar, store):
    """One distinct x-session-id value is recorded; two different values are not."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    url = rollout_url(sidecar.url, "r1", CHAT)
    await fetch(http, "POST", url, CHAT_JSON_REQUEST, {"x-session-id": "sess-1", "x-assistant-message-id": "am-1"})
    async with http.post(url, data=CHAT_JSON_REQUEST, headers=[("x-session-id", "a"), ("x-session-id", "b")]) as response:
        await response.read()
    first, second = store.read("r1")
    assert (first["client_session_id"], first["client_assistant_message_id"]) == ("sess-1", "am-1")
    assert "client_session_id" not in second


async def test_the_harnesses_own_session_headers_name_the_session(http, upstream, sidecar, store):
    """Claude Code's `x-claude-code-session-id` and Codex CLI's `session-id` are read when the
    configured header (`x-session-id`) is absent; it wins when sent; both reach the upstream."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    url = rollout_url(sidecar.url, "r1", CHAT)
    for headers in ({"x-claude-code-session-id": "claude-1"}, {"session-id": "codex-1"},
                    {"x-claude-code-session-id": "claude-2", "x-session-id": "ours"}, {}):
        await fetch(http, "POST", url, CHAT_JSON_REQUEST, headers)
        for name, value in headers.items():
            assert upstream.received[-1].header(name) == value
    lines = store.read("r1")
    assert [line.get("client_session_id") for line in lines] == ["claude-1", "codex-1", "ours", None]


async def test_the_harnesses_agent_headers_name_the_agent_and_mcc_show_groups_by_it(http, upstream, sidecar, store,
                                                                                      capture_dir):
    """Claude Code's subagent headers (and Dynamo's parent session) are recorded as the call's agent
    and parent agent, read back by `records` (its call rows too), and `mcc show` groups by them."""
    from click.testing import CliRunner

    from proxy import main as cli_main
    from records import read_model_call_records

    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    url = rollout_url(sidecar.url, "agents", CHAT)
    main = {"x-claude-code-session-id": "s-1"}
    sent = [main, {**main, "x-claude-code-agent-id": "explore-1", "x-claude-code-parent-agent-id": "s-1"},
            {**main, "x-claude-code-agent-id": "explore-1", "x-claude-code-parent-agent-id": "s-1"}, main,
            {"x-dynamo-parent-session-id": "planner"}]
    for headers in sent:
        await fetch(http, "POST", url, CHAT_JSON_REQUEST, headers)
        for name, value in headers.items():
            assert upstream.received[-1].header(name) == value
    lines = store.read("agents")
    assert [(line.get("client_agent_id"), line.get("client_parent_agent_id")) for line in lines] == [
        (None, None), ("explore-1", "s-1"), ("explore-1", "s-1"), (None, None), (None, "planner")]
    assert "client_agent_id" not in lines[0] and lines[1]["client_session_id"] == "s-1"
    records = read_model_call_records(capture_dir, "agents")
    assert [r.client_agent_id for r in records] == [None, "explore-1", "explore-1", None, None]
    assert records[4].client_parent_agent_id == "planner"
    shown = CliRunner().invoke(cli_main, ["show", capture_dir, "agents"], catch_exceptions=False).output
    assert "2 agents (the harness's agent headers):" in shown
    assert "  no agent id (the main agent), started by planner: 3 calls #0 #3 #4" in shown
    assert "  agent explore-1, started by s-1: 2 calls #1 #2" in shown


async def test_malformed_json_request_is_forwarded_unchanged_and_kept_raw(http, upstream, sidecar, store):
    """A body that is not a JSON object reaches the upstream as sent; the line has `request_raw`."""
    upstream.scripts[CHAT] = json_script(b'{"error": {"message": "bad json"}}', 400, "Bad Request")
    body = b'{"model": "m", "messages": [\xff'
    await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), body)
    assert upstream.received[-1].body == body
    (line,) = store.read("r1")
    assert line["request"] is None and line["request_raw"] == body.decode("utf-8", "replace")
    assert line["error_category"] == "client_error"


async def test_json_array_request_is_not_an_object(http, upstream, sidecar, store):
    """Valid JSON that is not an object is kept in `request_raw` too."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), b"[1, 2]")
    (line,) = store.read("r1")
    assert line["request"] is None and line["request_raw"] == "[1, 2]"


async def test_responses_stream_is_reassembled_from_its_terminal_event(http, upstream, sidecar, store):
    """A Responses stream's line carries the terminal event's response object and the raw SSE text."""
    upstream.scripts["/v1/responses"] = sse_script(RESPONSES_STREAM, split_every(RESPONSES_STREAM, 17))
    await fetch(http, "POST", rollout_url(sidecar.url, "r1", "/v1/responses"), RESPONSES_REQUEST)
    (line,) = store.read("r1")
    assert line["dialect"] == "responses" and line["response"]["status"] == "completed"
    assert line["response"]["output"][0]["content"][0]["text"] == "Hello"
    assert line["response_raw"] == RESPONSES_STREAM.decode()


async def test_capture_is_off_by_default(http, upstream, start, tmp_path, monkeypatch):
    """Without a capture dir nothing is written anywhere, and the prefix is still stripped."""
    monkeypatch.chdir(tmp_path)
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    sidecar = await start(upstream.url)
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_JSON_REQUEST)
    assert reply.status == 200 and upstream.received[-1].target == CHAT
    assert [files for _, _, files in os.walk(tmp_path) if files] == []


async def test_capture_disabled_explicitly_writes_nothing(http, upstream, start, capture_dir):
    """observability_enabled false with a directory set: forwarded, not captured."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_enabled=False)
    await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_JSON_REQUEST)
    assert os.listdir(capture_dir) == []


@pytest.mark.parametrize("encoded_id", ["..", "%2e%2e", "%2E%2E", "a%2Fb", "a%20b", "a" * 201, "", ".hidden",
                                        "-dash", "a%00b", "caf%C3%A9", "%ff", "a%5Cb"])
async def test_invalid_rollout_id_gets_400_and_touches_nothing(http, upstream, sidecar, capture_dir, tmp_path, encoded_id):
    """A bad rollout id is refused in the dialect's error shape; no request goes upstream, no file appears."""
    before = sorted(os.listdir(tmp_path))
    reply = await fetch(http, "POST", f"{sidecar.url}/ng-rollout/{encoded_id}/v1/messages", CHAT_JSON_REQUEST)
    assert reply.status == 400
    body = orjson.loads(reply.body)
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert upstream.received == [] and rollout_files(capture_dir) == [] and sorted(os.listdir(tmp_path)) == before


async def test_invalid_rollout_id_on_openai_path_uses_openai_shape(http, upstream, sidecar):
    reply = await fetch(http, "POST", f"{sidecar.url}/ng-rollout/%2e%2e/v1/chat/completions", CHAT_JSON_REQUEST)
    assert reply.status == 400 and orjson.loads(reply.body)["error"]["code"] == "invalid_rollout_id"


async def test_200_concurrent_calls_over_20_rollouts_give_200_intact_lines(http, upstream, sidecar, store):
    """Streaming and JSON calls in parallel: one intact line each, unique ids, dense call_index per file."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    upstream.scripts["/v1/responses"] = sse_script(RESPONSES_STREAM, split_every(RESPONSES_STREAM, 101))
    rng = random.Random(7)

    async def call(number: int) -> int:
        rollout = f"rollout-{number % 20}"
        if rng.random() < 0.5:
            return (await fetch(http, "POST", rollout_url(sidecar.url, rollout, CHAT), CHAT_JSON_REQUEST)).status
        return (await fetch(http, "POST", rollout_url(sidecar.url, rollout, "/v1/responses"), RESPONSES_REQUEST)).status

    statuses = await asyncio.gather(*(call(n) for n in range(200)))
    assert statuses == [200] * 200
    ids = set()
    for rollout in store.rollout_ids():
        result = store.read_available(rollout)
        assert result.malformed == 0 and len(result.lines) == 10
        ids.update(line["model_call_id"] for line in result.lines)
    assert len(store.rollout_ids()) == 20 and len(ids) == 200


@pytest.mark.parametrize("name", ["x-session-id", "x-smg-routing-key", "X-Dynamo-Session-ID"])
async def test_an_affinity_header_carries_the_rollout_id_upstream(http, upstream, start, capture_dir, store, name):
    """``--affinity-header NAME``: each captured call goes upstream with ``NAME: <rollout_id>``
    (a router places a session's calls together by it), with or without the token mode; an agent's
    own value is kept; an uncaptured call gets none; the bytes the agent receives are the upstream's."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    sidecar = await start(upstream.url, capture_dir=capture_dir, affinity_header=name)
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "task-7", CHAT), CHAT_JSON_REQUEST)
    assert reply.status == 200 and reply.body == CHAT_JSON
    assert upstream.received[-1].header(name) == "task-7"
    await fetch(http, "POST", rollout_url(sidecar.url, "task-7", CHAT), CHAT_JSON_REQUEST, {name: "agents-own"})
    assert [value for key, value in upstream.received[-1].headers if key.lower() == name.lower()] == ["agents-own"]
    await fetch(http, "POST", sidecar.url + CHAT, CHAT_JSON_REQUEST)
    assert upstream.received[-1].header(name) is None
