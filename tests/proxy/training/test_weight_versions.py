"""Weight versions (issue 32): from the engine (vLLM 0.33's ``return_weight_versions``, emulated by
the stand-in from vLLM's source; SGLang's ``metadata.weight_version``) and declared by the trainer
(``/-/weight-version``), split where an update fell in a stream, and carried into the records."""

from __future__ import annotations

import pytest

import asyncio
from typing import Any

import orjson

from capture import SSEParser
from proxy import start_stand_in
from records import read_token_entries, read_token_records
from tests.scripted_upstream import Script
from tests.wire import RUNNER, fetch, rollout_url

_JSON = {"Content-Type": "application/json"}
_ADMIN = {**_JSON, **RUNNER}  # What the trainer sends: the runner's admin token
_CHAT = {"model": "m", "messages": [{"role": "user", "content": "Count slowly to twenty, please."}], "stream": True}
#: Seconds between the stand-in's chunks: a generation's pace, so an update lands mid-stream.
_PACE = "0.03"


async def _stream_with_an_update(http, url: str, body: dict[str, Any], after_chunks: int, update) -> tuple[bytes, int]:
    """Stream ``body`` from ``url``; after ``after_chunks`` chunks with token data, await ``update()``.
    The reply's bytes, and how many token chunks the client had when it asked for the update."""
    received, seen = bytearray(), 0
    parser, updated = SSEParser(), False
    async with http.post(url, data=orjson.dumps(body), headers={**_JSON, "X-Stand-In-Pace": _PACE}) as response:
        async for piece in response.content.iter_any():
            received += piece
            for event in parser.feed(piece):
                if event.data != "[DONE]" and '"delta":{"' in event.data and '"role"' not in event.data:
                    seen += 1  # A chunk with a token (the first, the role's, has none).
            if not updated and seen >= after_chunks:
                updated, at = True, seen
                await update()
    return bytes(received), at


async def test_the_engines_spans_across_an_update_mid_stream_are_recorded_and_cut(http, start, capture_dir, store):
    """The stand-in, as vLLM 0.33, labels each token with the weights current when it was made; an
    update mid-stream gives two spans. The mode asked for them: the agent's bytes are those of its
    own request (``weight_versions: null``), the record and the entry have the spans."""
    stand_in = await start_stand_in()
    try:
        sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)

        async def update() -> None:
            reply = await fetch(http, "POST", stand_in.url + "/update_weight_version",
                                orjson.dumps({"new_version": "step-8"}), headers=_JSON)
            assert reply.status == 200

        proxied, _ = await _stream_with_an_update(
            http, rollout_url(sidecar.url, "engine", "/v1/chat/completions"), _CHAT, 5, update)
        direct = await fetch(http, "POST", stand_in.url + "/v1/chat/completions", orjson.dumps(_CHAT), headers=_JSON)
    finally:
        await stand_in.close()
    assert proxied == direct.body, "the agent gets the bytes of its own request"
    assert b'"weight_versions":null' in proxied
    (record,) = read_token_records(store, "engine")
    generated = len(record.generation_token_ids)
    assert record.weight_version_source == "engine" and record.spans_weight_update
    (first, second) = record.weight_versions
    assert (first["version"], first["start"], second["version"], second["end"]) == ("default", 0, "step-8", generated)
    assert 5 <= first["end"] == second["start"] < generated
    assert record.token_weight_versions == ["default"] * first["end"] + ["step-8"] * (generated - first["end"])
    (entry,) = read_token_entries(capture_dir, "engine")
    assert entry["weight_versions"] == record.weight_versions and entry["weight_version_source"] == "engine"


async def test_a_declared_update_splits_a_stream_where_it_fell(http, upstream, start, capture_dir, store):
    """No engine version: the trainer's declaration is recorded, and a stream in flight across the
    next one gets two spans split at the ids the sidecar had relayed when it came."""
    stand_in = await start_stand_in()
    try:
        sidecar = await start(stand_in.url, capture_dir=capture_dir)
        declare = lambda version: fetch(http, "POST", sidecar.url + "/-/weight-version",  # noqa: E731
                                        orjson.dumps({"version": version}), headers=_ADMIN)
        assert (await declare("step-1")).status == 200
        asked = {**_CHAT, "return_token_ids": True}  # The agent's own ids: the sidecar can count a stream.

        async def update() -> None:
            reply = await declare("step-2")
            assert orjson.loads(reply.body)["version"] == "step-2"

        _, at = await _stream_with_an_update(http, rollout_url(sidecar.url, "declared", "/v1/chat/completions"),
                                             asked, 6, update)
        state = orjson.loads((await fetch(http, "GET", sidecar.url + "/-/weight-version")).body)
    finally:
        await stand_in.close()
    assert state["version"] == "step-2"
    (record,) = read_token_records(store, "declared")
    generated = len(record.generation_token_ids)
    assert record.weight_version_source == "declared" and record.spans_weight_update
    (first, second) = record.weight_versions
    assert (first["version"], second["version"]) == ("step-1", "step-2")
    assert at <= first["end"] == second["start"] < generated, "split where the update fell, never before what was seen"
    assert record.token_weight_versions.count("step-2") == generated - first["end"]


async def test_a_non_streamed_reply_across_a_declared_update_is_marked_unplaced(http, upstream, start, capture_dir, store):
    reply_body = orjson.dumps({"id": "c", "object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]})
    upstream.scripts["/v1/chat/completions"] = Script(  # A generation's time: the update falls in it.
        headers=[("Content-Type", "application/json"), ("Content-Length", str(len(reply_body)))], pieces=[reply_body],
        delay_head=0.5)
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    declare = lambda version: fetch(http, "POST", sidecar.url + "/-/weight-version",  # noqa: E731
                                    orjson.dumps({"version": version}), headers=_ADMIN)
    await declare("a")
    call = asyncio.ensure_future(fetch(http, "POST", rollout_url(sidecar.url, "flat", "/v1/chat/completions"),
                                       orjson.dumps({"model": "m", "messages": []}), headers=_JSON))
    await asyncio.sleep(0.2)
    await declare("b")
    assert (await call).body == reply_body
    (line,) = store.read("flat")
    assert line["weight_versions"] == [[{"version": "a", "start": 0, "end": None}]]
    assert line["weight_versions_unplaced"] is True
    (record,) = read_token_records(store, "flat")
    assert record.spans_weight_update and record.weight_version_source == "declared"


async def test_sglangs_metadata_version_is_read_as_it_passes(http, upstream, start, capture_dir, store):
    body = orjson.dumps({"id": "c", "object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop",
         "logprobs": {"content": [{"token": "hi", "logprob": -0.5}]}}], "prompt_token_ids": [1, 2],
        "metadata": {"weight_version": "v7"}}).replace(b'"finish_reason"', b'"token_ids":[9],"finish_reason"')
    upstream.scripts["/v1/chat/completions"] = Script(
        headers=[("Content-Type", "application/json"), ("Content-Length", str(len(body)))], pieces=[body])
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "sg", "/v1/chat/completions"), b'{"model":"m"}',
                        headers=_JSON)
    assert reply.body == body
    (record,) = read_token_records(store, "sg")
    assert record.weight_version_source == "engine" and record.token_weight_versions == ["v7"]
    assert not record.spans_weight_update


async def test_sglangs_per_token_spans_are_passed_through(http, upstream, start, capture_dir, store):
    """Newer SGLang (sgl-project/sglang #35926) sends ``metadata.weight_versions``: the spans over
    the output's tokens an update fell inside; the records take them as they came, with the first
    token's version and the ordered versions (vLLM RFC #54443's two asks)."""
    spans = [{"version": "v7", "start": 0, "end": 2}, {"version": "v8", "start": 2, "end": 3}]
    body = orjson.dumps({"id": "c", "object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi!"}, "finish_reason": "stop",
         "logprobs": {"content": [{"token": t, "logprob": -0.5} for t in ("h", "i", "!")]}}],
        "prompt_token_ids": [1, 2], "metadata": {"weight_version": "v8", "weight_versions": spans}}).replace(
        b'"finish_reason"', b'"token_ids":[9,10,11],"finish_reason"')
    upstream.scripts["/v1/chat/completions"] = Script(
        headers=[("Content-Type", "application/json"), ("Content-Length", str(len(body)))], pieces=[body])
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "sg-spans", "/v1/chat/completions"), b'{"model":"m"}',
                        headers=_JSON)
    assert reply.body == body
    (record,) = read_token_records(store, "sg-spans")
    assert record.weight_version_source == "engine" and record.token_weight_versions == ["v7", "v7", "v8"]
    assert record.spans_weight_update and record.first_token_weight_version == "v7"
    assert list(record.weight_version_labels) == ["v7", "v8"]


async def test_the_admin_endpoint_says_what_is_wrong_with_a_bad_declaration(http, upstream, start, capture_dir):
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    url = sidecar.url + "/-/weight-version"
    assert orjson.loads((await fetch(http, "GET", url)).body) == {"version": None, "declared_at": None}
    for bad in (b"not json", b'{"version": ""}', b'{"version": 3}', b"[]"):
        reply = await fetch(http, "POST", url, bad, headers=_ADMIN)
        assert reply.status == 400 and "version" in orjson.loads(reply.body)["error"], bad
    assert (await fetch(http, "PUT", url, b"{}")).status == 405
    assert orjson.loads((await fetch(http, "GET", url)).body)["version"] is None, "nothing was declared"
    assert not upstream.received, "the admin path is the sidecar's own"


def _chat_json(content: str, finish: str, prompt: list[int], ids: list[int]) -> bytes:
    """A vLLM chat reply with the token capture mode's arrays."""
    entries = [{"token": f"t{token}", "logprob": -0.5, "bytes": [116], "top_logprobs": []} for token in ids]
    return orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": {"content": entries},
         "finish_reason": finish, "stop_reason": None, "token_ids": ids}], "prompt_token_ids": prompt,
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)}})


async def test_an_aborted_call_is_its_own_category_and_the_call_resuming_it_is_stitched(http, upstream, start,
                                                                                          capture_dir, store, tmp_path):
    """vLLM aborts a call around a weight update (``finish_reason: "abort"``); the agent resumes it
    (its partial reply sent back, continued). The aborted call is ``aborted``, never usable, but its
    entry is kept; the next call ``resumes`` it, and the trajectory is one chain: the partial
    generation under the old version, the rest under the new one."""
    from records import read_model_call_records, trajectories
    question = [{"role": "user", "content": "Say hello."}]

    def respond(received):
        body = orjson.loads(received.body)
        reply = _chat_json("Hel", "abort", [1, 2, 3], [11, 12]) if len(body["messages"]) == 1 else \
            _chat_json("lo!", "stop", [1, 2, 3, 11, 12], [13, 14])
        return Script(headers=[("Content-Type", "application/json"), ("Content-Length", str(len(reply)))],
                      pieces=[reply])

    upstream.responder = respond
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    url = rollout_url(sidecar.url, "resumed", "/v1/chat/completions")
    declare = lambda version: fetch(http, "POST", sidecar.url + "/-/weight-version",  # noqa: E731
                                    orjson.dumps({"version": version}), headers=_ADMIN)
    await declare("v1")
    await fetch(http, "POST", url, orjson.dumps({"model": "m", "messages": question}), headers=_JSON)
    await declare("v2")
    resume = {"model": "m", "messages": [*question, {"role": "assistant", "content": "Hel"}],
              "continue_final_message": True, "add_generation_prompt": False}
    await fetch(http, "POST", url, orjson.dumps(resume), headers=_JSON)
    aborted, resumed = read_model_call_records(store, "resumed")
    assert (aborted.error_category, resumed.error_category) == ("aborted", None)
    first, second = read_token_records(store, "resumed")
    assert not first.usable and "abort" in first.unusable_reason
    assert second.usable and second.resumes == aborted.model_call_id
    assert (first.first_token_weight_version, second.first_token_weight_version) == ("v1", "v2")
    build = trajectories(capture_dir, "resumed")
    assert not build.masked, build.mask_reason
    assert build.main.token_ids == [1, 2, 3, 11, 12, 13, 14]
    assert build.main.loss_mask == [0, 0, 0, 1, 1, 1, 1]
    assert build.main.weight_versions == [None, None, None, "v1", "v1", "v2", "v2"]
    await _the_surfaces_carry_them(capture_dir, tmp_path, aborted.model_call_id)


async def _the_surfaces_carry_them(capture_dir: str, tmp_path, aborted_id: str) -> None:
    """`mcc show`, `stats`, the report, Parquet and the Ray rows carry the versions and the resume."""
    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from proxy import main
    from records.training import rollout_rows_of, trajectory_rows
    runner = CliRunner()
    shown = runner.invoke(main, ["show", capture_dir, "resumed", "--call", "1"]).output
    assert f"resumes the aborted call {aborted_id}" in shown and "weight versions (declared): v2 [0, end)" in shown, shown
    as_json = [orjson.loads(line) for line in runner.invoke(main, ["show", capture_dir, "resumed", "--json"]).output.splitlines()]
    assert [(row["resumes"], row["weight_version_source"]) for row in as_json] == [(None, "declared"), (aborted_id, "declared")]
    table = runner.invoke(main, ["show", capture_dir, "resumed"]).output
    assert "weights v1" in table and "weights v2" in table and "main: #0 -> #1;" in table and "weights v1, v2" in table
    stats = runner.invoke(main, ["stats", capture_dir]).output
    assert "weight versions     v1 1, v2 1 generations; 0 spanning an update" in stats, stats
    assert "aborted, resumed    1 calls resumed an aborted one" in stats
    assert "aborted 1" in stats, "its own error category"
    output = str(tmp_path / "chains.parquet")
    assert runner.invoke(main, ["export", capture_dir, "--format", "parquet", "--trajectories", "-o", output]).exit_code == 0
    (row,) = pq.read_table(output).to_pylist()
    assert row == trajectory_rows(capture_dir, "resumed")[0]
    assert row["weight_versions"] == [None, None, None, "v1", "v1", "v2", "v2"] and row["weight_version_labels"] == ["v1", "v2"]
    tokens = rollout_rows_of(capture_dir, "resumed", "tokens")
    assert [(r["weight_version_labels"], r["resumes"], r["usable"]) for r in tokens] == [
        (["v1"], None, False), (["v2"], aborted_id, True)]
    report = tmp_path / "report.html"
    assert runner.invoke(main, ["report", capture_dir, "-o", str(report)]).exit_code == 0
    assert "resumes the aborted call" in report.read_text()


async def test_the_mode_names_the_rollout_as_the_session_upstream_unless_the_agent_did(http, upstream, start, capture_dir):
    """vLLM 0.33 routes and caches a session by ``X-Session-ID``: the token capture mode sends the
    rollout's id; an agent's own header is kept; without the mode nothing is added."""
    reply = _chat_json("hi", "stop", [1], [2])
    upstream.scripts["/v1/chat/completions"] = Script(
        headers=[("Content-Type", "application/json"), ("Content-Length", str(len(reply)))], pieces=[reply])
    moded = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    plain = await start(upstream.url, capture_dir=capture_dir)
    body = orjson.dumps({"model": "m", "messages": []})
    await fetch(http, "POST", rollout_url(moded.url, "r-1", "/v1/chat/completions"), body, headers=_JSON)
    await fetch(http, "POST", rollout_url(moded.url, "r-2", "/v1/chat/completions"), body,
                headers={**_JSON, "x-session-id": "agent-own"})
    await fetch(http, "POST", rollout_url(plain.url, "r-3", "/v1/chat/completions"), body, headers=_JSON)
    sessions = [[value for name, value in request.headers if name.lower() == "x-session-id"]
                for request in upstream.received]
    assert sessions == [["r-1"], ["agent-own"], []]


@pytest.mark.slow
def test_every_worker_takes_a_declaration_made_to_one(tmp_path):
    """``--workers 2``: connections are spread over the workers; a version declared on one is read
    back on every new connection (the supervisor passes it to each worker), and calls made after
    it record it, whichever worker served them."""
    import time
    import urllib.request

    from records import CaptureStore
    from tests.processes import SidecarProcess, post_chat

    from tests.wire import RUNNER_TOKEN

    # The token reaches every worker in its environment (never on a command line: `ps`).
    sidecar = SidecarProcess.start("--stand-in", "--workers", "2", "--capture-dir", str(tmp_path),
                                   env={"MCC_ADMIN_TOKEN": RUNNER_TOKEN})
    try:
        request = urllib.request.Request(sidecar.url + "/-/weight-version", data=b'{"version": "step-3"}',
                                         headers=_ADMIN, method="POST")
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert orjson.loads(reply.read())["version"] == "step-3"
        time.sleep(0.5)  # The supervisor's signal, then each worker's read: milliseconds.
        versions = set()
        for _ in range(24):  # A fresh connection each: the kernel spreads them over both workers.
            with urllib.request.urlopen(sidecar.url + "/-/weight-version", timeout=30) as reply:
                versions.add(orjson.loads(reply.read())["version"])
        for index in range(16):
            assert post_chat(sidecar.url, f"w-{index}", close=True)[0] == 200
        lines = [line for index in range(16) for line in CaptureStore(str(tmp_path)).read(f"w-{index}")]
    finally:
        assert sidecar.terminate() == 0
    assert versions == {"step-3"}
    assert {line["weight_versions"][0][0]["version"] for line in lines} == {"step-3"}
