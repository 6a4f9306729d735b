"""Gym's training-token files written by the sidecar (issue 31, points 1-3): one entry per call
under the store protocol, lineage resolved before each call is sent, resolved children stored as
the suffix after their parent, the rollout's sequence rebuilt and verified from the file."""

from __future__ import annotations

import asyncio
import json
import os

import orjson
import pytest

from records.contract import RolloutLineage, TokenFiles, request_items
from records.contract.reading import assistant_fingerprint, token_digest
from records.store import late_entries
from records import read_token_entries
from tests.scripted_upstream import json_script
from tests.vllm_chat_model import TinyChatModel
from tests.wire import fetch, rollout_url

SYSTEM = {"role": "system", "content": "Be brief."}


def serve_model(upstream, model: TinyChatModel) -> None:
    calls = []

    def respond(received):
        calls.append(received)
        return json_script(model.body(orjson.loads(received.body), len(calls)))

    upstream.responder = respond


async def converse(http, sidecar, rollout: str, turns: list[str], path: str = "/v1/chat/completions") -> list[dict]:
    """An agent loop: each reply sent back as an assistant turn, then the next user turn."""
    messages = [SYSTEM]
    replies = []
    for text in turns:
        messages.append({"role": "user", "content": text})
        reply = await fetch(http, "POST", rollout_url(sidecar.url, rollout, path),
                            orjson.dumps({"model": "m", "messages": messages}))
        assert reply.status == 200
        message = orjson.loads(reply.body)["choices"][0]["message"]
        replies.append(message)
        messages.append({"role": "assistant", "content": message["content"]})
    return replies


async def test_a_faithful_conversation_is_one_chain_stored_once(http, upstream, start, capture_dir, store):
    """Three turns: a root, then two children resolved to the call before, each storing only its
    new prompt ids; the whole sequence rebuilt from the file is what the model saw last."""
    model = TinyChatModel()
    serve_model(upstream, model)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    await converse(http, sidecar, "chain", ["hi", "more", "thanks"])
    entries = read_token_entries(capture_dir, "chain")
    lines = store.read("chain")
    assert [e["model_call_id"] for e in entries] == [line["model_call_id"] for line in lines]
    assert [e["parent_resolution"] for e in entries] == ["root", "resolved", "resolved"]
    assert [e["parent_call_id"] for e in entries] == [None, entries[0]["model_call_id"], entries[1]["model_call_id"]]
    assert [e["prompt_is_delta"] for e in entries] == [False, True, True]
    last_request = lines[-1]["request"]
    full = model.render(last_request["messages"]) + [*(100 + ord(c) for c in "reply 3"), 0]
    assert entries[-1]["cum_len"] == len(full) and entries[-1]["digest"] == token_digest(full)
    lineage = RolloutLineage(TokenFiles(capture_dir), "chain")
    lineage.refresh()
    assert lineage.sequence(entries[-1]["model_call_id"]) == full
    stored = sum(len(e["prompt_token_ids"]) + len(e["generation_token_ids"]) for e in entries)
    assert stored == len(full), "each token is stored once"
    assert TokenFiles(capture_dir).intents("chain") == [e["model_call_id"] for e in entries]
    state = TokenFiles(capture_dir).state("chain")
    assert state["indexed_size"] == os.path.getsize(os.path.join(capture_dir, "chain.tokens.jsonl"))
    assert set(state["entry_digests"]) == {e["model_call_id"] for e in entries} and not state["frozen"]


async def test_a_template_that_drops_the_models_turns_is_resolved_but_stored_whole(http, upstream, start, capture_dir):
    """The lineage holds (the request carries the earlier reply) but the prompt ids do not extend
    the parent's: the child keeps its whole prompt, for the builder to find the broken link."""
    serve_model(upstream, TinyChatModel(drop_assistant_turns=True))
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    await converse(http, sidecar, "drift", ["hi", "more"])
    first, second = read_token_entries(capture_dir, "drift")
    assert second["parent_resolution"] == "resolved" and second["parent_call_id"] == first["model_call_id"]
    assert second["prompt_is_delta"] is False


async def test_an_edited_history_or_a_new_conversation_is_not_a_child(http, upstream, start, capture_dir):
    """A request whose model-authored turns match no call is unresolved (``no_match``); one with
    none is a root, even in a rollout that has calls."""
    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    await converse(http, sidecar, "edit", ["hi"])
    edited = [SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "something else"},
              {"role": "user", "content": "more"}]
    for messages in (edited, [SYSTEM, {"role": "user", "content": "fresh"}]):
        await fetch(http, "POST", rollout_url(sidecar.url, "edit", "/v1/chat/completions"),
                    orjson.dumps({"model": "m", "messages": messages}))
    _, edited_entry, fresh = read_token_entries(capture_dir, "edit")
    assert (edited_entry["parent_resolution"], edited_entry["parent_resolution_reason"]) == ("unresolved", "no_match")
    assert edited_entry["parent_call_id"] is None and not edited_entry["prompt_is_delta"]
    assert fresh["parent_resolution"] == "root"


async def test_identical_retries_collapse_and_the_child_resolves(http, upstream, start, capture_dir):
    """The same request sent twice (a retry) gives the same sequence: the next turn resolves to the
    first of them, never 'ambiguous'."""
    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    url = rollout_url(sidecar.url, "retry", "/v1/chat/completions")
    first_turn = [SYSTEM, {"role": "user", "content": "hi"}]
    for _ in range(2):
        await fetch(http, "POST", url, orjson.dumps({"model": "m", "messages": first_turn}))
    await fetch(http, "POST", url, orjson.dumps({"model": "m", "messages": [
        *first_turn, {"role": "assistant", "content": "reply 1"}, {"role": "user", "content": "more"}]}))
    a, b, child = read_token_entries(capture_dir, "retry")
    assert a["digest"] == b["digest"]
    assert child["parent_resolution"] == "resolved" and child["parent_call_id"] == min(a["model_call_id"], b["model_call_id"])


def _freeze(files: TokenFiles, rollout_id: str) -> None:
    """What Gym's `freeze_now` leaves in the state file."""
    state = files.state(rollout_id)
    state.update(frozen=True, snapshot_id="s1", version=state["version"] + 1)
    with open(files.path(rollout_id, ".tokens.state.json"), "wb") as handle:
        handle.write(orjson.dumps(state))


async def test_a_frozen_rollout_takes_no_new_call_and_the_call_still_goes(http, upstream, start, capture_dir):
    """Gym froze the rollout: the next call is forwarded as ever; no intent, no entry joins the file."""
    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    await converse(http, sidecar, "frozen", ["hi"])
    files = TokenFiles(capture_dir)
    _freeze(files, "frozen")
    replies = await converse(http, sidecar, "frozen", ["again"])
    assert replies[0]["content"] == "reply 1"
    assert len(read_token_entries(capture_dir, "frozen")) == 1 and len(files.intents("frozen")) == 1
    metrics = (await fetch(http, "GET", sidecar.url + "/-/metrics")).body.decode()
    assert 'mcc_token_entry_failures_total{kind="closed"} 1.0' in metrics


def test_an_entry_that_comes_after_the_freeze_is_kept_as_evidence(tmp_path):
    """A call in flight when Gym froze its rollout: its entry goes to the late file, whole."""
    files = TokenFiles(str(tmp_path))
    entry = {"schema_version": 1, "rollout_id": "r", "model_call_id": "c1", "prompt_token_ids": [1],
             "generation_token_ids": [2], "generation_log_probs": [-0.5]}
    files.begin_call("r", ["c1", "c2"])
    assert files.append(entry) == "written" and files.append(entry) == "same"
    _freeze(files, "r")
    late = {**entry, "model_call_id": "c2"}
    assert files.append(late) == "late"
    assert read_token_entries(str(tmp_path), "r") == [entry] and late_entries(str(tmp_path), "r") == [late]


def test_a_reused_call_id_with_other_content_marks_the_rollout_incomplete(tmp_path):
    files = TokenFiles(str(tmp_path))
    entry = {"schema_version": 1, "rollout_id": "r", "model_call_id": "c1", "prompt_token_ids": [1],
             "generation_token_ids": [2], "generation_log_probs": [-0.5]}
    files.append(entry)
    with pytest.raises(ValueError, match="other content"):
        files.append({**entry, "generation_log_probs": [-0.7]})
    assert files.state("r")["incomplete"] is True


def test_a_torn_last_line_and_a_lost_index_are_repaired_under_the_lock(tmp_path):
    """A writer killed between its entry and its state write, and one killed mid-line: the next
    append indexes the first entry and drops the torn bytes nobody was told were written."""
    files = TokenFiles(str(tmp_path))
    entry = {"schema_version": 1, "rollout_id": "r", "model_call_id": "c1", "prompt_token_ids": [1],
             "generation_token_ids": [2], "generation_log_probs": [-0.5]}
    with open(files.path("r"), "wb") as handle:
        handle.write(orjson.dumps(entry, option=orjson.OPT_SORT_KEYS) + b'\n{"schema_version": 1, "rollo')
    second = {**entry, "model_call_id": "c2"}
    assert files.append(second) == "written"
    assert read_token_entries(str(tmp_path), "r") == [entry, second]
    assert set(files.state("r")["entry_digests"]) == {"c1", "c2"}


def test_a_long_rollout_is_indexed_by_two_writers_without_its_state_replaced_per_entry(tmp_path):
    """Issue 34: the state file indexes every entry of a rollout, so replacing it per entry is
    quadratic in a long rollout. Two writers (two sidecar workers) interleave 40 entries: the state
    is never replaced, yet a reader sees every entry indexed, each writer knows the other's (a
    repeat is ``same``, other content is refused), and a freeze by another process is seen."""
    directory = str(tmp_path)
    first, second = TokenFiles(directory), TokenFiles(directory)

    def entry(number: int, logprob: float = -0.5) -> dict:
        return {"schema_version": 1, "rollout_id": "r", "model_call_id": f"c{number}", "prompt_token_ids": [1],
                "generation_token_ids": [2, number], "generation_log_probs": [logprob, logprob]}

    for number in range(40):
        assert (first if number % 3 else second).append(entry(number)) == "written"
    assert not os.path.exists(first.path("r", ".tokens.state.json"))
    state = TokenFiles(directory).state("r")
    assert set(state["entry_digests"]) == {f"c{n}" for n in range(40)}
    assert state["indexed_size"] == os.path.getsize(first.path("r"))
    assert first.append(entry(3)) == "same" and second.append(entry(4)) == "same"
    with pytest.raises(ValueError, match="other content"):
        first.append(entry(39, logprob=-0.7))  # Written by the other writer.
    freezer = TokenFiles(directory)
    with freezer._locked("r"):
        _, frozen = freezer._state("r")
        frozen["frozen"] = True
        freezer._write_state("r", frozen, durable=True)
    assert first.append(entry(40)) == "late" and second.append(entry(41)) == "late"
    assert [e["model_call_id"] for e in read_token_entries(directory, "r")] == [f"c{n}" for n in range(40)]


async def test_gyms_training_path_turns_the_mode_on_for_that_call(http, upstream, start, capture_dir, store):
    """`/ng-rollout/<id>/training-token-capture/v1/...` (Gym's URL contract): the fields are added
    and cut for that call, the prefix is stripped upstream, and the call gets its entry."""
    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    body = orjson.dumps({"model": "m", "messages": [SYSTEM, {"role": "user", "content": "hi"}]})
    direct = await fetch(http, "POST", upstream.url + "/v1/chat/completions", body)
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "gym", "/training-token-capture/v1/chat/completions"), body)
    assert upstream.received[-1].target == "/v1/chat/completions"
    assert b'"return_token_ids":true' in upstream.received[-1].body
    assert orjson.loads(proxied.body) == {**orjson.loads(direct.body), "id": orjson.loads(proxied.body)["id"]}
    (entry,) = read_token_entries(capture_dir, "gym")
    assert entry["parent_resolution"] == "root" and entry["generation_token_ids"]
    await fetch(http, "POST", rollout_url(sidecar.url, "plain", "/v1/chat/completions"), body)
    assert read_token_entries(capture_dir, "plain") == [], "without the mode, no entries"


def test_request_items_and_fingerprints_of_the_three_shapes():
    chat = {"messages": [SYSTEM, {"role": "assistant", "content": "a"}], "tools": [{"type": "function"}]}
    items = request_items(chat)
    assert items[0]["role"] == "_ng_request_envelope" and items[1:] == chat["messages"]
    assert request_items({"input": "hi"}) == [], "a string input is no turn (Gym's rule)"
    assert assistant_fingerprint(request_items({"input": [{"type": "function_call", "call_id": "c", "name": "f",
                                                           "arguments": "{}"}]}))


@pytest.mark.parametrize("bad", [{"schema_version": 2}, {"generation_log_probs": [0.1, 0.2]}])
def test_a_newer_or_inconsistent_entry_is_refused(tmp_path, bad):
    from records.contract.reading import TokenEntryProblem, check_token_entry
    entry = {"schema_version": 1, "rollout_id": "r", "model_call_id": "c", "prompt_token_ids": [1],
             "generation_token_ids": [2], "generation_log_probs": [-0.5], **bad}
    with pytest.raises(TokenEntryProblem):
        check_token_entry(entry)


async def test_trajectories_chain_a_conversation_and_mask_what_is_unsafe(http, upstream, start, capture_dir):
    """`records.trajectories`: the clean conversation is one unmasked chain (loss on the sampled ids
    only, their logprobs, each call's span); a drifting one and one with a lost call are masked, with why."""
    from records import trajectories
    model = TinyChatModel()
    serve_model(upstream, model)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    await converse(http, sidecar, "clean", ["hi", "more"])
    build = trajectories(capture_dir, "clean")
    assert not build.masked and build.mask_reason is None and len(build.chains) == 1
    main = build.main
    entries = read_token_entries(capture_dir, "clean")
    generated = [e["generation_token_ids"] for e in entries]
    assert [main.token_ids[c.start:c.end] for c in main.calls] == generated
    assert [c.model_call_id for c in main.calls] == [e["model_call_id"] for e in entries]
    assert sum(main.loss_mask) == sum(map(len, generated)) and len(main.loss_mask) == len(main.token_ids)
    assert all((lp is None) == (mask == 0) for lp, mask in zip(main.logprobs, main.loss_mask))
    serve_model(upstream, TinyChatModel(drop_assistant_turns=True))
    await converse(http, sidecar, "drift", ["hi", "more"])
    drift = trajectories(capture_dir, "drift")
    assert drift.masked and "without a verified parent" in drift.mask_reason
    assert drift.notes["parent_link_failures"] == {"parent_digest_mismatch": 1}
    upstream.responder = None
    await fetch(http, "POST", rollout_url(sidecar.url, "clean", "/v1/chat/completions"),
                orjson.dumps({"model": "m", "messages": [SYSTEM, {"role": "user", "content": "x"}]}))
    lost = trajectories(capture_dir, "clean")
    for _ in range(100):  # Published in flight by a tick during the call: read again, as the reason says.
        if not lost.notes.get("call_in_flight"):
            break
        await asyncio.sleep(0.02)
        lost = trajectories(capture_dir, "clean")
    assert lost.masked and "dispatched without an entry" in lost.mask_reason


async def test_a_retry_names_the_call_it_repeats(http, upstream, start, capture_dir, store):
    """An SDK retry (the same body, ``x-stainless-retry-count``) and a plain resend record ``retry_of``
    on the line, the token record and the entry; a different body does not."""
    from records import read_token_records
    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    url = rollout_url(sidecar.url, "retried", "/v1/chat/completions")
    body = orjson.dumps({"model": "m", "messages": [SYSTEM, {"role": "user", "content": "hi"}]})
    await fetch(http, "POST", url, body)
    await fetch(http, "POST", url, body, headers={"x-stainless-retry-count": "1"})
    await fetch(http, "POST", url, body)
    await fetch(http, "POST", url, orjson.dumps({"model": "m", "messages": [SYSTEM, {"role": "user", "content": "no"}]}))
    first, second, third, other = store.read("retried")
    assert "retry_of" not in first and "retry_of" not in other
    assert second["retry_of"] == first["model_call_id"] and third["retry_of"] == second["model_call_id"]
    assert [r.retry_of for r in read_token_records(store, "retried")] == [None, first["model_call_id"],
                                                                         second["model_call_id"], None]
    assert read_token_entries(capture_dir, "retried")[1]["retry_of"] == first["model_call_id"]


async def test_a_resend_equal_as_json_names_the_call_it_repeats(http, upstream, start, capture_dir, store):
    """Codex CLI re-serialises ``client_metadata`` with its keys in another order when it resends after a
    cut stream: a body equal as JSON (key order and spacing aside) is a retry too, on the line and, in
    the token mode, on the token record and entry; one differing value is not."""
    from records import read_token_records
    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    url = rollout_url(sidecar.url, "resent", "/v1/chat/completions")
    messages = [SYSTEM, {"role": "user", "content": "hi"}]
    first_body = orjson.dumps({"model": "m", "messages": messages, "metadata": {"a": "1", "b": "2"}})
    reordered = json.dumps({"metadata": {"b": "2", "a": "1"}, "messages": messages, "model": "m"}, indent=1).encode()
    changed = orjson.dumps({"model": "m", "messages": messages, "metadata": {"a": "1", "b": "3"}})
    for body in (first_body, reordered, changed):
        await fetch(http, "POST", url, body)
    first, second, third = store.read("resent")
    assert second["retry_of"] == first["model_call_id"] and "retry_of" not in third
    assert [r.retry_of for r in read_token_records(store, "resent")] == [None, first["model_call_id"], None]
    assert read_token_entries(capture_dir, "resent")[1]["retry_of"] == first["model_call_id"]
    assert list(orjson.loads(upstream.received[1].body))[:3] == ["metadata", "messages", "model"]  # As it came.


async def test_a_reordered_responses_resend_is_a_retry_without_the_token_mode(http, upstream, sidecar, store):
    """Without the token mode the JSON key is taken when the line is built: the same rule."""
    upstream.scripts["/v1/responses"] = json_script(b'{"id": "resp_1", "object": "response", "status": "completed", '
                                                    b'"output": []}')
    url = rollout_url(sidecar.url, "codex", "/v1/responses")
    request = {"model": "m", "input": "hi", "client_metadata": {"x-codex-turn": "1", "x-codex-window": "w"}}
    again = {"client_metadata": {"x-codex-window": "w", "x-codex-turn": "1"}, "input": "hi", "model": "m"}
    for body in (request, again, again, {**request, "input": "other"}):
        await fetch(http, "POST", url, orjson.dumps(body))
        assert upstream.received[-1].body == orjson.dumps(body)
    lines = store.read("codex")
    assert [line.get("retry_of") for line in lines] == [None, lines[0]["model_call_id"], lines[1]["model_call_id"], None]


async def test_show_export_and_report_carry_the_chains(http, upstream, start, capture_dir, tmp_path):
    """`mcc show` ends with the rollout's trajectory, `mcc export --trajectories` writes one row per
    chain (as `ray_dataset(kind="trajectories")`), and the report names the chain."""
    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from proxy import main
    from records.training import trajectory_rows
    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    await converse(http, sidecar, "clean", ["hi", "more"])
    runner = CliRunner()
    shown = runner.invoke(main, ["show", capture_dir, "clean"]).output
    assert "trajectory: trainable" in shown and "main: #0 -> #1;" in shown, shown
    output = str(tmp_path / "chains.parquet")
    done = runner.invoke(main, ["export", capture_dir, "--format", "parquet", "--trajectories", "-o", output])
    assert done.exit_code == 0 and "1 chains" in done.output, done.output
    (row,) = pq.read_table(output).to_pylist()
    (expected,) = trajectory_rows(capture_dir, "clean")
    assert row == expected
    report = tmp_path / "report.html"
    assert runner.invoke(main, ["report", capture_dir, "-o", str(report)]).exit_code == 0
    assert "trajectory: trainable; main: #0 -&gt; #1" in report.read_text() or "trajectory: trainable; main: #0 -> #1" in report.read_text()
    calls = str(tmp_path / "calls.parquet")
    assert runner.invoke(main, ["export", capture_dir, "--format", "parquet", "-o", calls]).exit_code == 0
    assert {row["added_request_fields"] for row in pq.read_table(calls).to_pylist()} == {
        '{"logprobs":true,"return_token_ids":true,"return_weight_versions":true}'}, "the arrays the sidecar asked for, against the agent's own"


async def test_show_call_and_json_say_the_drift_and_what_was_added(http, upstream, start, capture_dir):
    """`mcc show --call N` names the fields the sidecar added, the arrays, and the drift (from which
    call, at which token, what to do); `show --json` rows carry usable, extends, drift_at, drift_from."""
    from click.testing import CliRunner

    from proxy import main
    serve_model(upstream, TinyChatModel(drop_assistant_turns=True))
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    await converse(http, sidecar, "drift", ["hi", "more"])
    runner = CliRunner()
    shown = runner.invoke(main, ["show", capture_dir, "drift", "--call", "1"]).output
    assert "added to the request by the sidecar (cut from the agent's reply): logprobs=true, return_token_ids=true" in shown
    assert "drifts from call #0 at token" in shown and "A trainer should mask it" in shown, shown
    rows = [orjson.loads(line) for line in runner.invoke(main, ["show", capture_dir, "drift", "--json"]).output.splitlines()]
    assert [(r["usable"], r["extends"], r["drift_from"]) for r in rows] == [(True, None, None), (True, None, 0)]
    assert rows[1]["drift_at"] is not None


async def test_a_streamed_call_and_a_json_call_keep_the_same_entry_and_the_same_agent_view(http, stand_in, start,
                                                                                          capture_dir, store):
    """A chat stream's entry comes from the ids and logprobs kept as it streamed, a JSON body's from
    its line: the same arrays either way (the stand-in answers both alike), the same view on the
    line, the arrays read back from the token file."""
    from records import read_token_records
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    chat = {"model": "m", "messages": [{"role": "user", "content": "same"}]}
    for rollout, body in (("json", chat), ("stream", {**chat, "stream": True})):
        await fetch(http, "POST", rollout_url(sidecar.url, rollout, "/v1/chat/completions"), orjson.dumps(body))
    (from_json,), (streamed,) = read_token_entries(capture_dir, "json"), read_token_entries(capture_dir, "stream")
    for key in ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "digest", "cum_len"):
        assert from_json[key] == streamed[key], key
    json_line, stream_line = store.read("json")[0], store.read("stream")[0]
    assert stream_line["token_entries"] == [stream_line["model_call_id"]]
    choice = stream_line["response"]["choices"][0]
    assert choice["logprobs"] is None and choice["token_ids"] is None and stream_line["response"]["prompt_token_ids"] is None
    assert json_line["response"]["choices"][0]["logprobs"] is None
    (record,) = read_token_records(store, "stream")
    assert record.source == "token_file" and record.generation_log_probs == streamed["generation_log_probs"]


async def test_show_call_summarises_per_token_lists_unless_full(http, stand_in, start, capture_dir):
    """Issue 33, point 5: an agent that asked for logprobs itself keeps them on its line; `show --call`
    says them in one line, `--full` prints them whole."""
    from click.testing import CliRunner

    from proxy import main
    sidecar = await start(stand_in.url, capture_dir=capture_dir)
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                         "return_token_ids": True})
    await fetch(http, "POST", rollout_url(sidecar.url, "asked", "/v1/chat/completions"), body)
    runner = CliRunner()
    short = runner.invoke(main, ["show", capture_dir, "asked", "--call", "0"]).output
    full = runner.invoke(main, ["show", capture_dir, "asked", "--call", "0", "--full"]).output
    assert "logprob entries; --full prints them)" in short and "ids; --full prints them)" in short
    assert '"logprob":' not in short and '"logprob":' in full
    assert len(short.splitlines()) * 3 < len(full.splitlines())


async def test_a_stream_whose_entry_is_not_written_keeps_its_logprobs_in_the_line(http, upstream, start, capture_dir, store):
    """Issue 34: in the token capture mode a stream's logprob entries are not held (only their
    floats); a call whose entry cannot be written (its rollout is frozen) keeps the arrays in its
    line all the same, each logprob as an entry: nothing is lost."""
    from records.contract import TokenFiles
    from records import read_token_records
    from tests.scripted_upstream import sse_script
    from tests.vllm_chat_model import FRAMINGS, chat_payloads, text_tokens

    stream = FRAMINGS["lf"](chat_payloads([text_tokens("Hel", "lo", "!")], logprobs=True, token_ids=True))
    upstream.scripts["/v1/chat/completions"] = sse_script(stream, [stream])
    files = TokenFiles(capture_dir)
    files.begin_call("frozen", ["x"])
    with files._locked("frozen"):
        _, state = files._state("frozen")
        state["frozen"] = True
        files._write_state("frozen", state, durable=True)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "frozen", "/v1/chat/completions"), body)
    assert reply.status == 200 and b'"logprob"' not in reply.body, "the agent's bytes are cut"
    (line,) = store.read("frozen")
    assert "token_entries" not in line
    (record,) = read_token_records(store, "frozen")
    assert record.usable and record.generation_log_probs and \
        len(record.generation_log_probs) == len(record.generation_token_ids)


async def test_an_intent_is_on_disk_before_the_agent_gets_a_byte_of_the_reply(http, stand_in, start, capture_dir,
                                                                              monkeypatch):
    """docs/tokens.md: a call's intent is durable before the agent gets a byte of its reply. A stream's
    is flushed while the request goes upstream; a reply asked for whole (cut as one JSON body, held
    until its capture line is durable) has its intent flushed by that line's barrier -- one flush
    for the call, not two (issue 34) -- and both before the agent sees the reply's head. Watched on
    the writer threads (this process); the capture process's barrier covers a job's files before
    its acknowledgement (tests/capture/journal/test_capture_process.py)."""
    import capture.journal._group_commit as group_commit
    import capture.journal._writer as capture_writer
    from records.contract.writing import GroupSync

    def no_process(*args, **kwargs):
        raise OSError("the writer threads' way is watched here")
    monkeypatch.setattr(capture_writer, "CaptureProcess", no_process)

    events: list[tuple[str, tuple[str, ...]]] = []
    barrier, also_durable = GroupSync._barrier, group_commit.GroupCommitter._also_durable

    def flushed(self, batch):
        failure = barrier(self, batch)
        events.append(("flushed", tuple(os.path.basename(path) for path in batch)))
        return failure

    def with_the_line(also, synced_device):
        also_durable(also, synced_device)
        events.append(("with the line", tuple(os.path.basename(p) for _, _, (paths, _) in also for p in paths)))

    monkeypatch.setattr(GroupSync, "_barrier", flushed)
    monkeypatch.setattr(group_commit.GroupCommitter, "_also_durable", staticmethod(with_the_line))
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    chat = {"model": "m", "messages": [{"role": "user", "content": "intent"}]}
    for rollout, body in (("whole", chat), ("streamed", {**chat, "stream": True})):
        events.clear()
        async with http.post(rollout_url(sidecar.url, rollout, "/v1/chat/completions"), data=orjson.dumps(body)) as reply:
            seen = list(events)  # What was on disk when the agent got the head.
            assert reply.status == 200
            await reply.read()
        intents = f"{rollout}.tokens.intents"
        durable_at_head = [kind for kind, paths in seen if intents in paths]
        if rollout == "whole":
            assert durable_at_head == ["with the line"], seen
        else:
            assert durable_at_head == ["flushed"], seen
    assert TokenFiles(capture_dir).intents("whole") and TokenFiles(capture_dir).intents("streamed")


async def test_an_evals_independent_calls_read_as_independent_not_masked(http, upstream, start, capture_dir):
    """An eval's rollout of separate questions (no call continues another) keeps NeMo Gym's verdict
    in `records.trajectories` (masked: one trajectory per rollout), but `mcc show` and the report say
    what it is, "independent calls", not an alarm; a rollout that lost a call still reads masked."""
    from click.testing import CliRunner

    from proxy import main
    from records import trajectories
    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    for question in ("one", "two", "three"):
        await converse(http, sidecar, "eval-sample", [question])
    build = trajectories(capture_dir, "eval-sample")
    assert build.masked and build.notes["roots"] == 3, "the records keep Gym's verdict"
    shown = CliRunner().invoke(main, ["show", capture_dir, "eval-sample"]).output
    assert "trajectory: 3 independent calls" in shown and "trajectory: masked" not in shown, shown
    with open(os.path.join(capture_dir, "eval-sample.tokens.intents"), "ab") as handle:
        handle.write(b"lost-call\n")  # A call dispatched whose entry never came: the rollout lost it.
    shown = CliRunner().invoke(main, ["show", capture_dir, "eval-sample"]).output
    assert "trajectory: masked (" in shown, shown


#: A 145-digit integer, as vLLM 0.32 wrote one in a tool call's arguments (`chat-tools-bigint`).
_BIG = 173231922049322000000424173031616488132980432643411327825177819722106464602787833241280021910033315808048588533240102217150307991017899993215


def _bigint_stream(arrays: bool) -> bytes:
    """A vLLM-shaped chat stream of one tool call whose arguments hold `_BIG`; with ``arrays``, as
    the token mode's request gets it (prompt ids, per-chunk ids and logprobs), else as asked."""
    head = {"id": "chatcmpl-big", "object": "chat.completion.chunk", "created": 1796084165, "model": "tiny"}
    arguments = f'{{"a": 0, "b": {_BIG}}}'

    def chunk(delta: dict, ids: list[int], finish=None, prompt=None) -> bytes:
        entries = {"content": [{"token": f"t{i}", "logprob": -0.5, "bytes": [116], "top_logprobs": []} for i in ids]}
        choice = {"index": 0, "delta": delta, "logprobs": entries if arrays and ids else None, "finish_reason": finish}
        if finish:
            choice["stop_reason"] = None
        choice["token_ids"] = ids if arrays else None
        body = {**head, "choices": [choice]}
        if prompt is not None:
            body["prompt_token_ids"] = prompt if arrays else None
        return b"data: " + orjson.dumps(body) + b"\n\n"

    call = {"id": "chatcmpl-tool-1", "type": "function", "index": 0, "function": {"name": "add", "arguments": arguments}}
    return (chunk({"role": "assistant", "content": ""}, [], prompt=[1, 2, 3])
            + chunk({"tool_calls": [call]}, [40, 41, 42, 43]) + chunk({}, [2], finish="tool_calls") + b"data: [DONE]\n\n")


@pytest.mark.parametrize("split", ["whole", "1-byte", "random"])
async def test_a_streamed_tool_call_with_an_integer_beyond_64_bits_keeps_its_entry_and_its_next_turn(
        http, upstream, start, capture_dir, split):
    """Issue 45, point 1, streamed: the tool call's arguments hold an integer past 64 bits (which
    orjson cannot write); its entry is written and the next turn, sending the call back, resolves
    to it, whatever the reads; the agent gets the stream its own request would have had."""
    import random

    from tests.scripted_upstream import sse_script, split_every

    sent, expected = _bigint_stream(arrays=True), _bigint_stream(arrays=False)
    if split == "1-byte":
        pieces = split_every(sent, 1)
    elif split == "random":
        cuts = sorted(random.Random(45).sample(range(1, len(sent)), 30))
        pieces = [sent[a:b] for a, b in zip([0, *cuts], [*cuts, len(sent)])]
    else:
        pieces = [sent]
    follow_up = {"id": "chatcmpl-2", "object": "chat.completion", "created": 1, "model": "tiny",
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                              "logprobs": {"content": [{"token": "d", "logprob": -0.1, "bytes": [100], "top_logprobs": []}]},
                              "finish_reason": "stop", "stop_reason": None, "token_ids": [50]}],
                 "usage": {"prompt_tokens": 11, "total_tokens": 12, "completion_tokens": 1},
                 "prompt_token_ids": [1, 2, 3, 40, 41, 42, 43, 2, 7, 8, 9]}

    def respond(request):
        body = orjson.loads(request.body)
        return json_script(orjson.dumps(follow_up)) if len(body["messages"]) > 1 else sse_script(sent, pieces)

    upstream.responder = respond
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    url = rollout_url(sidecar.url, "big", "/v1/chat/completions")
    request = {"model": "tiny", "messages": [{"role": "user", "content": "add"}], "stream": True}
    reply = await fetch(http, "POST", url, orjson.dumps(request))
    assert reply.status == 200 and reply.body == expected
    call = {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "add", "arguments": f'{{"b":{_BIG},"a":0}}'}}
    request = {"model": "tiny", "messages": [*request["messages"], {"role": "assistant", "content": None, "tool_calls": [call]},
                                             {"role": "tool", "tool_call_id": "chatcmpl-tool-1", "content": "big"}]}
    assert (await fetch(http, "POST", url, orjson.dumps(request))).status == 200
    first, second = read_token_entries(capture_dir, "big")
    assert first["generation_token_ids"] == [40, 41, 42, 43, 2] and second["parent_call_id"] == first["model_call_id"]
    from records import trajectories
    assert trajectories(capture_dir, "big").masked is False
