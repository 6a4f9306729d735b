"""Redaction that fails closed (docs/privacy.md): secrets planted in what agents send and get back --
e-mail addresses, an API key's shape, a custom pattern, a value the stream splits across its chunks,
tool arguments, Anthropic and Responses shapes, a zstd-compressed request body -- go through the
sidecar with ``--redact`` (and the token capture mode); afterwards every byte of every file the
sidecar wrote, and every log line, is searched: no secret is there, and the agent's bytes are a
direct call's. Metrics-only keeps no content and the same counts; a hook that raises or sleeps past
its budget leaves the line in metrics-only form, marked and counted."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
import textwrap
import time

import orjson
import pytest

from proxy.app import Settings
from records import read_model_call_records, read_token_entries
from tests.codecs import COMPRESS
from tests.processes import read_line
from tests.scripted_upstream import sse_script
from tests.wire import fetch, rollout_url

EMAIL = "ada.lovelace@example.com"
API_KEY = "sk-proj-Q7x2Lm9Vt4Bn8Kd3Hs6Fw1Zr5Pc0Ye7Ju2"
CUSTOM = "ACME-424242"
#: The placeholder of the ``email`` rule: its tag, a keyed digest of the value (docs/privacy.md).
PLACEHOLDER = re.compile(r"\[REDACTED:email:([0-9a-f]{8})\]")
SECRETS = (EMAIL, API_KEY, CUSTOM)
RULES = textwrap.dedent(r"""
    rules:
      - name: email
        pattern: '[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}'
      - name: api_key
        pattern: 'sk-[A-Za-z0-9-]{20,}'
      - name: acme_id
        pattern: 'ACME-\d{6}'
""")


@pytest.fixture
def rules_file(tmp_path):
    path = tmp_path / "redact.yaml"
    path.write_text(RULES)
    return str(path)


def every_byte(*directories: str) -> bytes:
    """Everything under ``directories``, each file's bytes."""
    found = []
    for directory in directories:
        for root, _, names in os.walk(directory):
            for name in names:
                with open(os.path.join(root, name), "rb") as handle:
                    found.append(handle.read())
    return b"\n".join(found)


def assert_no_secret(data: bytes, where: str) -> None:
    for secret in SECRETS:
        assert secret.encode() not in data, f"{secret} is in {where}"
        assert secret.encode().hex().encode() not in data, f"{secret} (hex) is in {where}"


async def beside(http, direct_url: str, sidecar_url: str, rollout: str, path: str, body: bytes,
                 headers: dict | None = None) -> bytes:
    direct = await fetch(http, "POST", direct_url + path, body, headers=headers)
    proxied = await fetch(http, "POST", rollout_url(sidecar_url, rollout, path), body, headers=headers)
    assert (proxied.status, proxied.body) == (direct.status, direct.body), "the agent's bytes are a direct call's"
    return proxied.body


def said(text: str) -> str:
    return f"Write to {text} now"


async def planted_calls(http, stand_in, sidecar, rollout: str, token_mode: bool = False) -> None:
    """Every shape the issue names, each carrying the secrets (the stand-in echoes what it is told)."""
    chat = {"model": "m", "messages": [{"role": "user", "content": said(EMAIL)}]}
    await beside(http, stand_in.url, sidecar.url, rollout, "/v1/chat/completions", orjson.dumps(chat))
    # Streamed, with the token texts of its logprobs.
    await beside(http, stand_in.url, sidecar.url, rollout, "/v1/chat/completions",
                 orjson.dumps({**chat, "stream": True, "logprobs": True}))
    # Tool arguments sent back, with the key in them.
    tool_turn = {"model": "m", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "reasoning_content": f"the key is {API_KEY}",
         "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "send", "arguments": orjson.dumps({"key": API_KEY}).decode()}}]},
        {"role": "tool", "tool_call_id": "c1", "content": f"sent with {API_KEY}"}]}
    await beside(http, stand_in.url, sidecar.url, rollout, "/v1/chat/completions", orjson.dumps(tool_turn))
    # Anthropic Messages, streamed, and Responses.
    await beside(http, stand_in.url, sidecar.url, rollout, "/v1/messages", orjson.dumps({
        "model": "m", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": said(CUSTOM)}]}))
    await beside(http, stand_in.url, sidecar.url, rollout, "/v1/responses", orjson.dumps({
        "model": "m", "input": said(EMAIL), "instructions": f"Never say {API_KEY}"}))
    # A request body compressed with zstd (Codex CLI's way).
    packed = COMPRESS["zstd"](orjson.dumps({"model": "m", "input": said(CUSTOM)}))
    headers = {"Content-Type": "application/json", "Content-Encoding": "zstd"}
    if token_mode:  # The mode decodes the body to add its fields and sends it identity-encoded (docs/tokens.md).
        await fetch(http, "POST", rollout_url(sidecar.url, rollout, "/v1/responses"), packed, headers=headers)
    else:
        await beside(http, stand_in.url, sidecar.url, rollout, "/v1/responses", packed, headers=headers)
    # The ids copied from the agent's headers to the line (issue 73: they escaped the rules); a tool
    # call in the reply (its arguments: counted by `mcc stats` as what they were, under metrics-only too).
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    await beside(http, stand_in.url, sidecar.url, rollout, "/v1/chat/completions", orjson.dumps(
        {**chat, "tools": [weather]}), headers={
        "Content-Type": "application/json", "x-session-id": f"sess-{EMAIL}", "x-assistant-message-id": API_KEY,
        "x-claude-code-agent-id": CUSTOM, "x-claude-code-parent-agent-id": f"parent-{CUSTOM}"})


@pytest.mark.parametrize("tokens", [False, True])
async def test_no_planted_secret_is_on_disk_or_in_a_log(http, stand_in, start, capture_dir, store, rules_file, caplog,
                                                       tokens):
    caplog.set_level(logging.DEBUG)
    sidecar = await start(stand_in.url, capture_dir=capture_dir, redact=rules_file, capture_tokens=tokens,
                          capture_raw_stream="always")
    await planted_calls(http, stand_in, sidecar, "planted", tokens)
    await sidecar.close()
    assert_no_secret(every_byte(capture_dir), "the capture directory")
    assert_no_secret("\n".join(record.getMessage() for record in caplog.records).encode(), "the logs")
    lines = store.read("planted")
    assert len(lines) == 7 and all(line["error_category"] is None for line in lines[:5])  # The stand-in refuses zstd.
    assert lines[5]["redactions"]["acme_id"] >= 1, "the zstd body was decoded and redacted"
    first = lines[0]
    (tag,) = set(PLACEHOLDER.findall(orjson.dumps(first["request"]).decode()))  # The rule's placeholder.
    assert first["redactions"]["email"] >= 2, first["redactions"]
    # The same value, the same placeholder, across the rollout's calls.
    assert set(PLACEHOLDER.findall(orjson.dumps(lines[4]["request"]).decode())) == {tag}
    assert lines[1]["response_raw"] is None and lines[1]["response_raw_dropped"] == "redaction"
    headers = lines[6]  # The headers' ids: the same rules, the same placeholders.
    assert re.fullmatch(r"\[REDACTED:email:[0-9a-f]{8}\]", headers["client_session_id"])  # "sess-" is in the match.
    assert re.fullmatch(r"\[REDACTED:api_key:[0-9a-f]{8}\]", headers["client_assistant_message_id"])
    assert re.fullmatch(r"parent-\[REDACTED:acme_id:[0-9a-f]{8}\]", headers["client_parent_agent_id"])
    if tokens:
        entries = read_token_entries(capture_dir, "planted")
        assert entries and all(entry["generation_token_ids"] for entry in entries), "training arrays kept"


async def test_metrics_only_keeps_no_content_and_the_same_counts(http, stand_in, start, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    full_dir, bare_dir = str(tmp_path / "full"), str(tmp_path / "bare")
    full = await start(stand_in.url, capture_dir=full_dir)
    bare = await start(stand_in.url, capture_dir=bare_dir, privacy="metrics-only", capture_tokens=True)
    await planted_calls(http, stand_in, full, "r")
    await planted_calls(http, stand_in, bare, "r")
    await full.close()
    await bare.close()
    everything = every_byte(bare_dir)
    assert_no_secret(everything, "the metrics-only directory")
    assert_no_secret("\n".join(record.getMessage() for record in caplog.records).encode(), "the logs")
    for text in (b"Write to", b"Never say", b"Hello from the stand-in", b"sent with"):
        assert text not in everything, text
    assert not [name for name in os.listdir(bare_dir) if ".tokens." in name], "no token files"
    facts = lambda record: (record.dialect, record.status_code, record.tokens_in, record.tokens_out,  # noqa: E731
                            record.finish_reason, record.error_category,
                            [call.get("name") if isinstance(call, dict) else call for call in record.tool_calls or ()])
    assert [facts(r) for r in read_model_call_records(bare_dir, "r")] == \
        [facts(r) for r in read_model_call_records(full_dir, "r")]
    assert all(r.latency_total_ms is not None for r in read_model_call_records(bare_dir, "r")), "timing kept"
    # `mcc stats` says the same of both runs (but the times, which differ run to run, and the time
    # the scan took; both runs have them).
    from click.testing import CliRunner

    from proxy.inspection.cli import stats_command
    stats = [orjson.loads(CliRunner().invoke(stats_command, [where, "--json"]).output) for where in (bare_dir, full_dir)]
    for one in stats:
        assert one["latency_ms"]["p50"] is not None
        del one["latency_ms"], one["ttft_ms"], one["scan_seconds"]
    assert stats[0] == stats[1]
    assert stats[0]["tool_calls"] >= 1 and stats[0]["tool_calls_with_invalid_arguments"] == 0
    assert all(line["privacy"] == "metrics-only" for line in orjson.loads(b"[" + b",".join(
        open(os.path.join(bare_dir, "r.capture.jsonl"), "rb").read().splitlines()) + b"]"))


def raising_hook(text: str) -> str:
    raise RuntimeError(f"cannot redact {text}")


def sleeping_hook(text: str) -> str:
    time.sleep(0.6)
    return text


@pytest.mark.parametrize("hook, kind", [("raising_hook", "error"), ("sleeping_hook", "timeout")])
async def test_a_failing_hook_leaves_the_line_without_content_marked_and_counted(http, stand_in, start, capture_dir,
                                                                               store, caplog, hook, kind):
    caplog.set_level(logging.DEBUG)
    sidecar = await start(stand_in.url, capture_dir=capture_dir, redact_hook=f"{__name__}:{hook}",
                          redact_hook_budget=0.2)
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": said(EMAIL)}]})
    await beside(http, stand_in.url, sidecar.url, "hooked", "/v1/chat/completions", body)
    (line,) = store.read("hooked")
    assert line["redaction_failed"] is True and line["request"]["messages"][0]["content"] == "[REDACTED]"
    assert_no_secret(every_byte(capture_dir), "the capture directory")
    assert_no_secret("\n".join(record.getMessage() for record in caplog.records).encode(), "the logs")
    metrics = await fetch(http, "GET", sidecar.url + "/-/metrics")
    assert f'mcc_redaction_failures_total{{kind="{kind}"}} 1.0'.encode() in metrics.body


def slow_on_one_hook(text: str) -> str:
    """Past any budget on the one text that says SLOW (as a hook calling a service that stalls)."""
    if "SLOW" in text:
        time.sleep(3.0)
    return text.replace("ACME", "[ACME]")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_slow_hook_holds_back_its_own_line_and_no_other(http, stand_in, start, capture_dir, store, stream):
    """Issue 73, point 2: 12 calls at once, the hook stalling past its budget on 5 of them. Only those
    are written metrics-only and marked; the 7 others, and a call made right after, are redacted as
    ever (before, lines queued behind one hook runner, each waiting its full budget, and the stalled
    hooks took every thread of a pool of 4: the call after them failed too). Counts, not timings
    (`make bench`'s bench_privacy times the others)."""
    sidecar = await start(stand_in.url, capture_dir=capture_dir, redact_hook=f"{__name__}:slow_on_one_hook",
                          redact_hook_budget=0.5)

    async def call(rollout: str, text: str) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": text}], **({"stream": True} if stream else {})}
        reply = await fetch(http, "POST", rollout_url(sidecar.url, rollout, "/v1/chat/completions"), orjson.dumps(body))
        assert reply.status == 200

    slow = {1, 4, 5, 8, 11}
    await asyncio.gather(*(call(f"c{index}", f"SLOW {CUSTOM}" if index in slow else f"call {index} {CUSTOM}")
                           for index in range(12)))
    await call("after", f"after {CUSTOM}")
    failed = {rollout: line.get("redaction_failed", False)
              for rollout in [*(f"c{index}" for index in range(12)), "after"] for line in store.read(rollout)}
    assert [rollout for rollout, marked in failed.items() if marked] == [f"c{index}" for index in sorted(slow)]
    for rollout in failed:
        (line,) = store.read(rollout)
        if not failed[rollout]:
            assert line["redactions"]["hook"] >= 1 and "[ACME]-424242" in line["request"]["messages"][0]["content"]
    assert_no_secret(every_byte(capture_dir), "the capture directory")  # c5's text is gone with it.


async def test_a_secret_split_across_chunks_is_found_at_every_split_point(http, upstream, start, capture_dir, store,
                                                                         rules_file):
    """The address cut in two at each of its positions, in two SSE chunks (and two reads): the
    rebuilt text is redacted, never chunk by chunk; the raw stream is not kept."""
    sidecar = await start(upstream.url, capture_dir=capture_dir, redact=rules_file, capture_raw_stream="always")
    body = orjson.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "mail?"}]})
    for cut in range(1, len(EMAIL)):
        chunks = [b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
                  + b"\n\n" for text in (f"Write to {EMAIL[:cut]}", f"{EMAIL[cut:]} now")]
        stream = b"".join(chunks) + b"data: [DONE]\n\n"
        upstream.scripts["/v1/chat/completions"] = sse_script(stream, pieces=[chunks[0], chunks[1], b"data: [DONE]\n\n"])
        reply = await fetch(http, "POST", rollout_url(sidecar.url, "split", "/v1/chat/completions"), body)
        assert reply.body == stream, "the agent's bytes are the upstream's"
    lines = store.read("split")
    assert len(lines) == len(EMAIL) - 1
    (said_back,) = {line["response"]["choices"][0]["message"]["content"] for line in lines}
    assert re.fullmatch(r"Write to \[REDACTED:email:[0-9a-f]{8}\] now", said_back), said_back
    assert_no_secret(every_byte(capture_dir), "the capture directory")


def test_a_rule_that_does_not_compile_stops_the_start(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: broken\n    pattern: '[unclosed'\n")
    with pytest.raises(ValueError, match="rule 'broken' does not compile"):
        Settings(upstream="http://127.0.0.1:9", capture_dir=str(tmp_path), redact=str(bad))
    with pytest.raises(ValueError, match="--redact-hook nowhere:thing"):
        Settings(upstream="http://127.0.0.1:9", capture_dir=str(tmp_path), redact_hook="nowhere:thing")


@pytest.mark.parametrize("text, said", [
    ("rules:\n  - name: k\n    pattern: 'sk-[a-z]+'\nredact_key: 00ff\n", "redact_key does not belong in the rules file"),
    ("rules:\n  - name: k\n    pattern: 'sk-[a-z]+'\nrule: x\n", "unknown key(s) rule: the rules file holds 'rules:' only"),
    ("rules:\n  - name: k\n    pattern: 'sk-[a-z]+'\n    flags: i\n", "rule 'k' has unknown key(s) flags"),
])
def test_the_rules_file_refuses_what_it_would_ignore(tmp_path, text, said):
    """Issue 73, point 6: a key the rules file would ignore (two sidecars then redact differently)
    stops the start with one sentence; the key belongs with the other secrets."""
    bad = tmp_path / "rules.yaml"
    bad.write_text(text)
    with pytest.raises(ValueError, match=re.escape(said)):
        Settings(upstream="http://127.0.0.1:9", capture_dir=str(tmp_path), redact=str(bad))


def test_keeping_token_ids_without_metrics_only_is_refused(tmp_path):
    with pytest.raises(ValueError, match="keeps token ids in a metrics-only line"):
        Settings(upstream="http://127.0.0.1:9", capture_dir=str(tmp_path), privacy_keep_token_ids=True)
    Settings(upstream="http://127.0.0.1:9", capture_dir=str(tmp_path), privacy="metrics-only",
             privacy_keep_token_ids=True)


def test_the_start_line_names_the_privacy_in_force(tmp_path, rules_file):
    from proxy.app import describe_startup

    def line(**settings) -> str:
        return describe_startup(Settings(upstream="http://127.0.0.1:9", capture_dir=str(tmp_path), **settings), "up")

    assert "privacy full, redaction rules email, api_key, acme_id (" in line(redact=rules_file)
    assert "redaction hook tests.proxy.privacy.test_redaction:raising_hook (budget 0.5s)" in line(
        redact_hook="tests.proxy.privacy.test_redaction:raising_hook", redact_hook_budget=0.5)
    assert "privacy metrics-only (token ids kept): no text is kept" in line(privacy="metrics-only",
                                                                          privacy_keep_token_ids=True)
    assert "privacy full: no redaction" in line()


async def test_a_bridged_websocket_turn_is_redacted(start, stand_in, capture_dir, rules_file, caplog):
    """A Responses WebSocket turn bridged to a streamed POST: its line goes through the same
    redaction; the client's frames are the upstream's events."""
    from tests.proxy.websocket.test_websocket import lines_of
    from tests.websockets_wire import RawSocket, create
    caplog.set_level(logging.DEBUG)
    sidecar = await start(stand_in.url, capture_dir=capture_dir, redact=rules_file)
    socket = await RawSocket.connect(sidecar.url, "/ng-rollout/socket/v1/responses")
    assert socket.status == 101, socket.head
    socket.send_text(create(said(EMAIL), instructions=f"Never say {API_KEY}"))
    events = await socket.until_ending()
    socket.close()
    # What the client receives is untouched (the bridge's bytes are held to a direct call's in
    # tests/proxy/websocket): its own secret comes back to it.
    assert EMAIL in orjson.dumps(events).decode() and events[-1]["type"] == "response.completed"
    (line,) = lines_of(capture_dir, "socket")
    assert line["websocket"]["mode"] == "bridge" and line["redactions"]["email"] >= 2
    await sidecar.close()
    assert_no_secret(every_byte(capture_dir), "the capture directory")
    assert_no_secret("\n".join(record.getMessage() for record in caplog.records).encode(), "the logs")


async def test_in_a_capture_store_neither_the_spool_nor_the_store_holds_a_secret(http, stand_in, start, tmp_path,
                                                                               rules_file, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    url = f"segments://{tmp_path}/store"
    sidecar = await start(stand_in.url, capture_dir=str(tmp_path / "spool"), capture_store=url, capture_tokens=True,
                          redact=rules_file, segment_max_age=0.1)
    await planted_calls(http, stand_in, sidecar, "stored", token_mode=True)
    await sidecar.close()  # The drain seals and uploads the segments and ships the token files.
    from records import Captures
    assert len(Captures(url).calls("stored")) == 7
    assert_no_secret(every_byte(str(tmp_path / "spool"), str(tmp_path / "store"), str(tmp_path / "cache")),
                     "the spool, the store and the readers' cache")
    assert_no_secret("\n".join(record.getMessage() for record in caplog.records).encode(), "the logs")


async def test_show_and_the_report_say_which_rules_replaced_how_many(http, stand_in, start, capture_dir, rules_file,
                                                                    tmp_path):
    from click.testing import CliRunner

    from proxy.inspection.cli import show_command
    from proxy.inspection.report import write_report
    from records import CaptureStore
    sidecar = await start(stand_in.url, capture_dir=capture_dir, redact=rules_file)
    await planted_calls(http, stand_in, sidecar, "shown")
    await sidecar.close()
    lines = CaptureStore(capture_dir).read("shown")
    totals: dict[str, int] = {}
    for line in lines:
        for rule, count in (line.get("redactions") or {}).items():
            totals[rule] = totals.get(rule, 0) + count
    shown = CliRunner().invoke(show_command, [capture_dir, "shown"])
    assert shown.exit_code == 0, shown.output
    expected = "redacted: " + ", ".join(f"{rule} {count:,}" for rule, count in sorted(totals.items()))
    assert expected in shown.output and set(totals) == {"email", "api_key", "acme_id"}
    one = CliRunner().invoke(show_command, [capture_dir, "shown", "--call", "0"])
    assert f"redacted: email {lines[0]['redactions']['email']}" in one.output
    page = str(tmp_path / "report.html")
    write_report(CaptureStore(capture_dir), ["shown"], page)
    assert expected in open(page, encoding="utf-8").read()
    # Every file derived from the redacted captures is as clean as they are (the header ids included:
    # Parquet has columns of their own).
    from proxy import main
    derived = tmp_path / "derived"
    derived.mkdir()
    for kind, name in (("parquet", "calls.parquet"), ("otel-json", "spans.jsonl"), ("atif", "atif.jsonl")):
        done = CliRunner().invoke(main, ["export", capture_dir, "--format", kind, "-o", str(derived / name)])
        assert done.exit_code == 0, done.output
    assert_no_secret(every_byte(str(derived)) + open(page, "rb").read() + every_byte(str(tmp_path / "report_files")),
                     "the report and the exports")


async def test_metrics_only_keeps_token_ids_when_told_and_never_a_text(http, stand_in, start, capture_dir, store):
    """``--privacy-keep-token-ids``: the token capture mode's files are written, with ids and
    logprob numbers; their output items and the lines keep no content."""
    sidecar = await start(stand_in.url, capture_dir=capture_dir, privacy="metrics-only", privacy_keep_token_ids=True,
                          capture_tokens=True)
    for stream in (False, True):
        body = {"model": "m", "messages": [{"role": "user", "content": said(EMAIL)}], "stream": stream}
        await beside(http, stand_in.url, sidecar.url, "ids", "/v1/chat/completions", orjson.dumps(body))
    await sidecar.close()
    entries = read_token_entries(capture_dir, "ids")
    assert len(entries) == 2 and all(e["prompt_token_ids"] and e["generation_token_ids"] and e["generation_log_probs"]
                                     for e in entries)
    everything = every_byte(capture_dir)
    assert_no_secret(everything, "the capture directory")
    assert b"Hello from the stand-in" not in everything and b"Write to" not in everything


async def test_a_refusal_that_quotes_the_request_is_not_logged(http, upstream, start, capture_dir, rules_file, caplog):
    """A validator's 422 may quote the request it refused (FastAPI's ``input``): the token capture
    mode learns the refused field, and its log names the field, never the refusal's text."""
    from tests.scripted_upstream import json_script
    caplog.set_level(logging.DEBUG)
    chat = {"model": "m", "messages": [{"role": "user", "content": said(EMAIL)}]}
    refusal = orjson.dumps({"detail": [{"type": "extra_forbidden", "loc": ["body", "return_token_ids"],
                                        "msg": "Extra inputs are not permitted", "input": chat}]})
    reply = orjson.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]})
    upstream.responder = lambda received: json_script(refusal, status=422, reason="Unprocessable Entity") \
        if b"return_token_ids" in received.body else json_script(reply)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True, redact=rules_file)
    answer = await fetch(http, "POST", rollout_url(sidecar.url, "refused", "/v1/chat/completions"), orjson.dumps(chat))
    assert (answer.status, answer.body) == (200, reply)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "refused the token capture mode's return_token_ids (422)" in logged
    assert_no_secret(logged.encode(), "the logs")
    assert_no_secret(every_byte(capture_dir), "the capture directory")


def _email_tags(capture_dir: str, rollout: str) -> list[str]:
    from records import CaptureStore
    return [tag for line in CaptureStore(capture_dir).read(rollout) for tag in PLACEHOLDER.findall(orjson.dumps(line["request"]).decode())]


@pytest.mark.slow
def test_every_worker_names_a_value_alike(tmp_path, rules_file):
    """`--workers 2`: a rollout's calls, each on a new connection, land on either worker
    (SO_REUSEPORT spreads them by their ports: thirty on one worker alone has a chance of 2^-29);
    the supervisor gives its workers one key, so one value has one placeholder in the rollout."""
    import urllib.request

    env = {key: value for key, value in os.environ.items() if key != "MCC_REDACT_KEY"}
    process = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--stand-in", "--port", "0", "--workers", "2",
                                "--capture-dir", str(tmp_path / "c"), "--redact", rules_file],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        url = read_line(process.stdout).split()[-1]
        body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": said(EMAIL)}]})
        for _ in range(30):
            request = urllib.request.Request(f"{url}/ng-rollout/spread/v1/chat/completions", data=body, method="POST",
                                             headers={"Connection": "close", "Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as reply:
                assert reply.status == 200
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0
    errors = process.stderr.read()  # type: ignore[union-attr]
    assert {line.split("mcc[worker ")[1][:4] for line in errors.splitlines() if "mcc[worker " in line} == {"1/2]", "2/2]"}
    tags = _email_tags(str(tmp_path / "c"), "spread")
    assert len(tags) == 30 and len(set(tags)) == 1, set(tags)
    assert EMAIL not in errors


async def test_sidecars_given_one_key_name_a_value_alike_and_another_key_differently(http, stand_in, start, tmp_path,
                                                                                    rules_file):
    """``MCC_REDACT_KEY``: several sidecars on one rollout (docs/privacy.md)."""
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": said(EMAIL)}]})
    tags = []
    for name, key in (("a", "ab" * 32), ("b", "ab" * 32), ("c", "cd" * 32), ("d", None)):
        sidecar = await start(stand_in.url, capture_dir=str(tmp_path / name), redact=rules_file, redact_key=key)
        await beside(http, stand_in.url, sidecar.url, "shared", "/v1/chat/completions", body)
        await sidecar.close()
        (tag,) = set(_email_tags(str(tmp_path / name), "shared"))
        tags.append(tag)
    assert tags[0] == tags[1] and len(set(tags)) == 3, tags
    assert "ab" * 32 not in every_byte(str(tmp_path / "a")).decode("utf-8", "replace"), "the key is not written"


def test_a_malformed_key_stops_the_start_without_being_echoed(tmp_path, rules_file):
    env = {**os.environ, "MCC_REDACT_KEY": "not-hex-secret-0123"}
    done = subprocess.run([sys.executable, "-m", "proxy", "serve", "--stand-in", "--capture-dir", str(tmp_path),
                           "--redact", rules_file], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and "MCC_REDACT_KEY" in done.stderr and "32 bytes" in done.stderr, done.stderr
    assert "not-hex-secret" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
