"""Ending a rollout with its outcome (issue 62, item 1 and the admin token, item 5): a durable end,
answered once, never changed; Gym's freeze: a later call is refused in its dialect and recorded;
the capture file keeps its shape."""

from __future__ import annotations

import os

import orjson
import pytest

from records import (
    GroupSizeConflict, RolloutEndConflict, UnknownRollout, end_rollout, read_model_call_records, read_rollout_end,
    read_token_entries, trajectories,
)
from records.contract import TokenFiles
from tests.scripted_upstream import json_script
from tests.proxy.training.test_token_files import converse, serve_model
from tests.transcripts import CHAT_JSON, CHAT_JSON_REQUEST, MESSAGES_REQUEST
from tests.vllm_chat_model import TinyChatModel
from tests.wire import RUNNER, fetch, rollout_url

CHAT = "/v1/chat/completions"
OUTCOME = {"reward": 0.75, "metrics": {"passed": 3, "failed": 1}}


def _end_url(sidecar_url: str, rollout_id: str) -> str:
    return f"{sidecar_url}/-/rollouts/{rollout_id}/end"


async def test_an_end_is_durable_answered_once_and_never_changed(http, upstream, sidecar, store, capture_dir):
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    for _ in range(2):
        assert (await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_JSON_REQUEST)).status == 200
    body = orjson.dumps({"outcome": OUTCOME, "group": "task-7", "group_size": 4})
    first = await fetch(http, "POST", _end_url(sidecar.url, "r1"), body, headers=RUNNER)
    assert first.status == 200, first.body
    answer = orjson.loads(first.body)
    assert answer["rollout_id"] == "r1" and answer["calls"] == 2 and answer["ended_at"] > 0
    end = read_rollout_end(capture_dir, "r1")
    assert end is not None and (end.outcome, end.group, end.group_size, end.calls) == (OUTCOME, "task-7", 4, 2)
    assert end.ended_at == answer["ended_at"]
    again = await fetch(http, "POST", _end_url(sidecar.url, "r1"), body, headers=RUNNER)
    assert again.status == 200 and orjson.loads(again.body)["ended_at"] == answer["ended_at"], "the first end again"
    file_before = open(os.path.join(capture_dir, "r1.end.json"), "rb").read()
    other = await fetch(http, "POST", _end_url(sidecar.url, "r1"), orjson.dumps({"outcome": {"reward": 0.0}}), headers=RUNNER)
    assert other.status == 409 and orjson.loads(other.body)["ended_at"] == answer["ended_at"]
    assert open(os.path.join(capture_dir, "r1.end.json"), "rb").read() == file_before, "nothing changed"
    # The capture file keeps its shape: two lines, read as before.
    assert [record.status_code for record in read_model_call_records(capture_dir, "r1")] == [200, 200]
    # A rollout with no trace is refused (a typo'd id); one that really made no call says so.
    unknown = await fetch(http, "POST", _end_url(sidecar.url, "nothing-yet"), headers=RUNNER)
    assert unknown.status == 404 and orjson.loads(unknown.body)["code"] == "unknown_rollout"
    assert read_rollout_end(capture_dir, "nothing-yet") is None
    empty = await fetch(http, "POST", _end_url(sidecar.url, "nothing-yet"), b'{"allow_empty": true}', headers=RUNNER)
    assert empty.status == 200 and orjson.loads(empty.body)["calls"] == 0
    assert read_rollout_end(capture_dir, "nothing-yet").outcome is None


@pytest.mark.parametrize("path, request_body, shape", [
    (CHAT, CHAT_JSON_REQUEST, "openai"),
    ("/v1/messages", MESSAGES_REQUEST, "anthropic"),
])
@pytest.mark.slow
async def test_a_call_after_the_end_is_refused_in_its_dialect_and_recorded(http, upstream, start, capture_dir, store,
                                                                           path, request_body, shape):
    """Gym's freeze: a call for an ended rollout never reaches the upstream; it gets 409 in its
    dialect's error shape, and its line says why -- on another sidecar sharing the directory too,
    and when the end was written from Python."""
    upstream.scripts[path] = json_script(CHAT_JSON)
    one = await start(upstream.url, capture_dir=capture_dir)
    two = await start(upstream.url, capture_dir=capture_dir)
    assert (await fetch(http, "POST", rollout_url(one.url, "ends", path), request_body)).status == 200
    assert (await fetch(http, "POST", _end_url(one.url, "ends"), orjson.dumps({"outcome": OUTCOME}), headers=RUNNER)).status == 200
    received_before = len(upstream.received)
    for sidecar in (one, two):
        refused = await fetch(http, "POST", rollout_url(sidecar.url, "ends", path), request_body)
        assert refused.status == 409
        assert dict(refused.headers)["x-mcc-local-response"] == "rollout_ended"
        error = orjson.loads(refused.body)
        if shape == "anthropic":
            assert error["type"] == "error" and "has ended" in error["error"]["message"]
        else:
            assert error["error"]["code"] == "rollout_ended" and "has ended" in error["error"]["message"]
    assert len(upstream.received) == received_before, "a refused call never reaches the upstream"
    lines = store.read("ends")
    assert [line["status_code"] for line in lines] == [200, 409, 409]
    assert all(line["response_source"] == "local" and line["local_response_reason"] == "rollout_ended"
               and line["error_category"] == "rollout_ended" for line in lines[1:])
    from click.testing import CliRunner

    from proxy import main
    (row,) = [orjson.loads(line) for line in CliRunner().invoke(main, ["ls", capture_dir, "--json", "--rollout", "ends"])
              .output.splitlines()]
    assert (row["calls"], row["turns"]) == (3, 1), "a call after the end is no turn"
    # Ended from Python, seen by the sidecar at its next call.
    end_rollout(capture_dir, "python-ended", outcome={"reward": 1}, allow_empty=True)
    assert (await fetch(http, "POST", rollout_url(two.url, "python-ended", path), request_body)).status == 409
    assert read_rollout_end(store, "python-ended").outcome == {"reward": 1}


async def test_an_ended_rollout_takes_no_token_entry_and_its_trajectory_is_what_it_had(http, upstream, start,
                                                                                       capture_dir):
    """The token capture mode: the end freezes the rollout's training-token files (Gym's state);
    the refused call has no intent and no entry; the trajectory is the two calls before the end."""
    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    await converse(http, sidecar, "tok", ["hi", "more"])
    before = trajectories(capture_dir, "tok")
    assert (await fetch(http, "POST", _end_url(sidecar.url, "tok"), orjson.dumps({"outcome": OUTCOME}), headers=RUNNER)).status == 200
    assert TokenFiles(capture_dir).state("tok")["frozen"] is True
    late = await fetch(http, "POST", rollout_url(sidecar.url, "tok", CHAT),
                       orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "late"}]}))
    assert late.status == 409
    assert len(read_token_entries(capture_dir, "tok")) == 2 and len(TokenFiles(capture_dir).intents("tok")) == 2
    after = trajectories(capture_dir, "tok")
    assert after.model_dump() == before.model_dump() and after.chains and not after.masked


@pytest.mark.parametrize("method, target, body, status", [
    ("POST", "/-/rollouts/..%2F..%2Fetc/end", b"", 400),
    ("POST", "/-/rollouts/r1/end", b"[1, 2]", 400),
    ("POST", "/-/rollouts/r1/end", b'{"outcome": [1]}', 400),
    ("POST", "/-/rollouts/r1/end", b'{"outcome": {}, "reward": 1}', 400),
    ("POST", "/-/rollouts/r1/end", b'{"group_size": 0}', 400),
    ("POST", "/-/rollouts/r1/end", b"{not json", 400),
    ("GET", "/-/rollouts/r1/end", None, 405),
])
async def test_a_bad_end_is_refused_with_a_reason_and_writes_nothing(http, sidecar, capture_dir, method, target, body,
                                                                     status):
    reply = await fetch(http, method, sidecar.url + target, body, headers=RUNNER)
    assert reply.status == status and orjson.loads(reply.body)["error"]
    assert not [name for name in os.listdir(capture_dir) if name.endswith(".end.json")]


async def test_without_capture_there_is_nothing_to_end(http, upstream, start):
    sidecar = await start(upstream.url)
    reply = await fetch(http, "POST", _end_url(sidecar.url, "r1"), headers=RUNNER)
    assert reply.status == 400 and "captures nothing" in orjson.loads(reply.body)["error"]


async def test_the_admin_token_guards_every_state_change_and_never_a_model_call(http, upstream, start, capture_dir):
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    sidecar = await start(upstream.url, capture_dir=capture_dir, admin_token="s3cret-token")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret-token"}):
        refused = await fetch(http, "POST", _end_url(sidecar.url, "r1"), b"", headers=headers)
        assert refused.status == 401 and "Bearer" in orjson.loads(refused.body)["error"]
        declared = await fetch(http, "POST", sidecar.url + "/-/weight-version", b'{"version": "v2"}', headers=headers)
        assert declared.status == 401
    assert read_rollout_end(capture_dir, "r1") is None
    assert orjson.loads((await fetch(http, "GET", sidecar.url + "/-/weight-version")).body).get("version") is None
    assert (await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_JSON_REQUEST)).status == 200
    granted = {"Authorization": "Bearer s3cret-token"}
    assert (await fetch(http, "POST", _end_url(sidecar.url, "r1"), b"", headers=granted)).status == 200
    assert (await fetch(http, "POST", sidecar.url + "/-/weight-version", b'{"version": "v2"}', headers=granted)).status == 200


@pytest.mark.slow
def test_end_rollout_from_python_checks_what_it_is_given(tmp_path):
    directory = str(tmp_path)
    first = end_rollout(directory, "r1", outcome={"reward": 1.5}, group="g", group_size=2, allow_empty=True)
    assert end_rollout(directory, "r1", outcome={"reward": 1.5}, group="g", group_size=2) == first
    with pytest.raises(RolloutEndConflict):
        end_rollout(directory, "r1", outcome={"reward": 1.5}, group="g", group_size=3, allow_empty=True)
    with pytest.raises(ValueError, match="outcome must be a JSON object"):
        end_rollout(directory, "r2", outcome=[1], allow_empty=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not finite"):
        end_rollout(directory, "r2", outcome={"reward": float("nan")}, allow_empty=True)
    # The same on a capture store (segments:// here; S3 in tests/records/training/test_handoff_store.py): an object of its own.
    store = f"segments://{tmp_path / 'store'}"
    on_store = end_rollout(store, "r1", outcome={"reward": 1.5}, group="g", group_size=2, allow_empty=True)
    assert on_store.calls is None and read_rollout_end(store, "r1") == on_store
    assert end_rollout(store, "r1", outcome={"reward": 1.5}, group="g", group_size=2) == on_store
    with pytest.raises(RolloutEndConflict):
        end_rollout(store, "r1", outcome={"reward": 2.0}, group="g", group_size=2)
    with pytest.raises(GroupSizeConflict):
        end_rollout(store, "r3", group="g", group_size=3, allow_empty=True)
    assert read_rollout_end(store, "r3") is None
    with pytest.raises(UnknownRollout):
        end_rollout(store, "r4")  # Nothing of it anywhere in the store: a typo.
    with pytest.raises(FileNotFoundError):
        end_rollout(str(tmp_path / "missing"), "r2")
    assert read_rollout_end(directory, "r2") is None


@pytest.mark.parametrize("host, args, token, warned", [("0.0.0.0", ["--open-admin"], None, True),
                                                       ("0.0.0.0", [], "t0ken", False),
                                                       ("127.0.0.1", ["--open-admin"], None, False)])
def test_a_sidecar_beyond_loopback_with_open_admin_says_so_once(tmp_path, host, args, token, warned):
    from tests.processes import SidecarProcess

    env = {"MCC_ADMIN_TOKEN": token} if token else None
    sidecar = SidecarProcess.start("--stand-in", "--host", host, "--port", "0", "--capture-dir", str(tmp_path / "c"),
                                   *args, env=env)
    assert sidecar.terminate() == 0
    said = [line for line in sidecar.stderr_lines if "with --open-admin" in line]
    assert len(said) == (1 if warned else 0), sidecar.stderr_lines
    assert token is None or not any(token in line for line in sidecar.stderr_lines), "the token is never logged"


async def test_two_ends_declaring_different_sizes_for_one_group_the_second_is_409(http, sidecar, capture_dir):
    first = await fetch(http, "POST", _end_url(sidecar.url, "7-0"), orjson.dumps({"group_size": 4, "allow_empty": True}), headers=RUNNER)
    assert first.status == 200
    second = await fetch(http, "POST", _end_url(sidecar.url, "7-1"), orjson.dumps({"group_size": 2, "allow_empty": True}), headers=RUNNER)
    assert second.status == 409 and "size 4" in orjson.loads(second.body)["error"]
    assert read_rollout_end(capture_dir, "7-1") is None, "nothing changed"
    assert (await fetch(http, "POST", _end_url(sidecar.url, "7-1"), orjson.dumps({"group_size": 4, "allow_empty": True}), headers=RUNNER)).status == 200


@pytest.mark.slow
async def test_an_end_waits_for_its_rollouts_call_under_way_and_refuses_new_ones_meanwhile(http, upstream, start,
                                                                                          capture_dir):
    """A stream still under way when its rollout is ended: the end's answer comes once that call's
    line is written (counted in ``calls``), and a call arriving meanwhile is refused."""
    import asyncio

    from tests.scripted_upstream import sse_script, split_every
    from tests.transcripts import CHAT_REQUEST, CHAT_STREAM

    upstream.scripts[CHAT] = sse_script(CHAT_STREAM, split_every(CHAT_STREAM, 64), pause=0.1)
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    streaming = asyncio.ensure_future(fetch(http, "POST", rollout_url(sidecar.url, "busy", CHAT), CHAT_REQUEST))
    await asyncio.sleep(0.3)  # The stream is under way.
    ending = asyncio.ensure_future(fetch(http, "POST", _end_url(sidecar.url, "busy"), orjson.dumps({"outcome": OUTCOME}), headers=RUNNER))
    await asyncio.sleep(0.1)
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    meanwhile = await fetch(http, "POST", rollout_url(sidecar.url, "busy", CHAT), CHAT_JSON_REQUEST)
    assert meanwhile.status == 409, "a rollout being ended takes no new call"
    assert not streaming.done() and not ending.done(), "the end waits for the call under way"
    stream_reply, end_reply = await streaming, await ending
    assert stream_reply.status == 200 and stream_reply.body == CHAT_STREAM
    assert end_reply.status == 200 and orjson.loads(end_reply.body)["calls"] == 2, "the stream's line and the refusal's"
