"""Real agent harnesses through the sidecar, against the stand-in (issue 44, point 7): Claude Code
(Messages, streamed; one run with zstd replies), Codex CLI (Responses over HTTP and over WebSocket,
bridged), the OpenAI Agents SDK (Responses JSON, streamed, WebSocket; Chat). Each run answers a
declared tool with a tool call, then a final text: the harness finishes; one line per model call;
the bytes the harness received equal those the stand-in sent; the records read."""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter

import orjson
import pytest

from records import read_model_call_records

from .recording import RecordingRelay, sse_data

pytestmark = pytest.mark.harness_e2e
FINAL_TEXT = "It is sunny and 22 degrees Celsius in Paris."
TIMINGS: dict[str, float] = {}


@pytest.fixture
async def wire(start, stand_in, capture_dir):
    """harness -> front relay -> sidecar -> back relay -> stand-in; both relays keep every byte."""
    back = await RecordingRelay(int(stand_in.url.rsplit(":", 1)[1])).start()
    sidecar = await start(f"http://127.0.0.1:{back.port}", capture_dir=capture_dir)
    front = await RecordingRelay(int(sidecar.url.rsplit(":", 1)[1])).start()
    yield front, back
    await front.close()
    await back.close()


async def run(name: str, argv: list[str], env: dict[str, str], cwd: str) -> str:
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(*argv, env={**os.environ, **env}, cwd=cwd,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 180)
    TIMINGS[name] = time.monotonic() - started
    print(f"\n{name}: {TIMINGS[name]:.1f} s")
    assert process.returncode == 0, (out + err).decode(errors="replace")[-3000:]
    return out.decode(errors="replace")


def model_replies(relay: RecordingRelay) -> Counter:
    return Counter((reply.status, reply.body) for reply in relay.replies() if reply.status != 405)


def assert_captured_whole(capture_dir: str, rollout_id: str, dialect: str, calls: int) -> list[dict]:
    with open(os.path.join(capture_dir, rollout_id + ".capture.jsonl"), "rb") as handle:
        lines = [orjson.loads(line) for line in handle]
    model_lines = [line for line in lines if not line.get("websocket", {}).get("prewarm")]
    assert len(model_lines) == calls, [line.get("websocket") for line in lines]
    for line in lines:
        assert line["dialect"] == dialect and line["status_code"] == 200 and line.get("error_category") is None, line
        assert line["response"] is not None and "failure" not in line and not line.get("stream_truncated")
    records = read_model_call_records(capture_dir, rollout_id)
    assert len(records) == len(lines)
    answered = [record for record, line in zip(records, lines) if not line.get("websocket", {}).get("prewarm")]
    assert answered[0].tool_calls and not answered[-1].tool_calls  # The tool call, then the final text.
    return lines


@pytest.mark.parametrize("encoding", [None, "zstd"], ids=["identity", "zstd-replies"])
async def test_claude_code(claude_bin, wire, capture_dir, tmp_path, encoding):
    front, back = wire
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{front.port}/ng-rollout/claude",
           "ANTHROPIC_API_KEY": "sk-harness", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1"}
    if encoding:
        env["ANTHROPIC_CUSTOM_HEADERS"] = f"X-Stand-In-Encoding: {encoding}"
    out = await run(f"claude-code-{encoding or 'identity'}",
                    [str(claude_bin), "-p", "What is the weather in Paris?", "--output-format", "json",
                     "--model", "claude-sonnet-4-5"], env, str(tmp_path))
    result = orjson.loads(out.strip().splitlines()[-1])
    assert result["result"] == FINAL_TEXT and result["is_error"] is False
    messages_posts = [r for r in back.replies() if r.headers.get("content-type", "").startswith("text/event-stream")]
    lines = assert_captured_whole(capture_dir, "claude", "messages", len(messages_posts))
    assert len(lines) >= 2 and lines[0]["response"]["stop_reason"] == "tool_use"
    assert {line.get("client_session_id") for line in lines} == {result["session_id"]}
    if encoding:
        assert all(r.headers.get("content-encoding") == encoding for r in messages_posts)
    assert model_replies(front) == model_replies(back)


@pytest.mark.parametrize("transport", ["http", "websocket"])
async def test_codex_cli(codex_bin, wire, capture_dir, tmp_path, transport):
    front, back = wire
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    provider = (f'model_providers.mcc={{name="mcc",base_url="http://127.0.0.1:{front.port}/ng-rollout/codex/v1",'
                f'wire_api="responses",env_key="MCC_HARNESS_KEY"'
                + (',supports_websockets=true}' if transport == "websocket" else '}'))
    argv = [str(codex_bin), "exec", "--skip-git-repo-check", "-c", "model_provider=mcc", "-c", provider,
            *(["-c", "features.responses_websockets=true"] if transport == "websocket" else []),
            "-m", "stand-in", "What is the weather in Paris?"]
    out = await run(f"codex-cli-{transport}", argv, {"HOME": str(home), "CODEX_HOME": str(home / ".codex"),
                                                     "MCC_HARNESS_KEY": "sk-harness"}, str(tmp_path))
    assert FINAL_TEXT in out
    streams = [r for r in back.replies() if r.headers.get("content-type", "").startswith("text/event-stream")]
    lines = assert_captured_whole(capture_dir, "codex", "responses", len(streams))
    model_lines = [line for line in lines if not line.get("websocket", {}).get("prewarm")]
    assert len(model_lines) == 2 and model_lines[0]["response"]["output"][-1]["type"] == "function_call"
    assert {line.get("client_session_id") for line in lines} != {None}  # Codex's own session-id header.
    assert lines[-1]["response"]["output"][-1]["content"][0]["text"] == FINAL_TEXT
    if transport == "websocket":
        assert {line["websocket"]["mode"] for line in lines} == {"bridge"}
        # The sidecar's own answers to a prewarm (``generate: false``) aside, every message is an event
        # the stand-in sent, in order.
        warm = {line["response"]["id"].encode() for line in lines if line["websocket"].get("prewarm")}
        relayed = [m for m in front.socket_messages() if not any(b'"id":"' + w + b'"' in m for w in warm)]
        assert relayed == [data for reply in streams for data in sse_data(reply.body)]
    else:
        assert model_replies(front) == model_replies(back)


@pytest.mark.parametrize("mode", ["responses", "responses-stream", "responses-websocket", "chat"])
async def test_openai_agents_sdk(agents_python, wire, capture_dir, tmp_path, mode):
    front, back = wire
    script = os.path.join(os.path.dirname(__file__), "agents_sdk_run.py")
    out = await run(f"agents-sdk-{mode}", [str(agents_python), script,
                                           f"http://127.0.0.1:{front.port}/ng-rollout/agents/v1", mode], {}, str(tmp_path))
    assert out.strip().splitlines()[-1] == FINAL_TEXT
    posts = back.replies()
    dialect = "chat" if mode == "chat" else "responses"
    lines = assert_captured_whole(capture_dir, "agents", dialect, len([r for r in posts if r.status == 200]))
    assert len(lines) == 2
    if mode == "responses-websocket":
        assert front.socket_messages() == [data for reply in posts if reply.status == 200 for data in sse_data(reply.body)]
    else:
        assert model_replies(front) == model_replies(back)
