"""The RL data plane in a team's hands (issue 71; docs/reading.md): a restarted trainer gets its
batch back at once, the loop ends when the run ends, an end names a real rollout, and one write
barrier whichever way the end came. Real processes and a real sidecar on loopback."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time

import orjson
import pytest

from records import Consumer, LeaseLost, UnknownRollout, end_rollout, end_run, read_rollout_end
from proxy.app.features import RolloutEndsFeature
from records.training import Fenced, consumer_view
from tests import CHECKOUT
from tests.scripted_upstream import json_script, sse_script
from tests.transcripts import CHAT_JSON, CHAT_JSON_REQUEST, CHAT_REQUEST, CHAT_STREAM
from tests.wire import fetch, rollout_url

CHAT = "/v1/chat/completions"


def _ended_groups(directory: str, groups: int, size: int = 4) -> list[str]:
    ids = []
    for task in range(groups):
        for member in range(size):
            rollout_id = f"task{task}-{member}"
            end_rollout(directory, rollout_id, outcome={"reward": member / size}, allow_empty=True)
            ids.append(rollout_id)
    return ids


# -- 1. a restart gets its batch back at once -------------------------------------------------------

_KILLED_MID_STEP = r'''
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from records import Consumer
trainer = Consumer(sys.argv[2], "trainer")
trainer.rewind(0)
batch = trainer.take(2, group_size=4)          # two groups of 4, leased (300 s by default)
print(" ".join(sorted(r.rollout_id for group in batch for r in group.rollouts)), flush=True)
os.kill(os.getpid(), signal.SIGKILL)           # killed mid-step: taken, never acknowledged
'''


def test_a_trainer_sigkilled_mid_step_takes_its_batch_back_at_its_restarts_first_take(tmp_path):
    directory = str(tmp_path)
    ids = _ended_groups(directory, 4)
    killed = subprocess.run([sys.executable, "-c", _KILLED_MID_STEP, CHECKOUT, directory], capture_output=True,
                            text=True, timeout=60)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    crashed_batch = killed.stdout.split()
    assert len(crashed_batch) == 8
    assert consumer_view(directory, "trainer").counts()["leased"] == 8, "leased to the dead process"
    began = time.monotonic()
    restarted = Consumer(directory, "trainer")       # the README's restart: a new start, then rewind
    restarted.rewind(0)
    first = restarted.take(2, group_size=4)
    assert time.monotonic() - began < 5, "at once, not after lease_seconds (300 s)"
    assert sorted(r.rollout_id for group in first for r in group.rollouts) == crashed_batch, "its own batch first"
    restarted.ack(first, step=1)
    restarted.commit(1)
    rest = restarted.take(10, group_size=4)
    restarted.ack(rest, step=2)
    restarted.commit(2)
    counts = restarted.counts()
    assert counts["final"] == 16 and counts["leased"] == 0 and counts["waiting"] == 0
    assert sorted(r.rollout_id for group in first + rest for r in group.rollouts) == sorted(ids), "each exactly once"


def test_an_earlier_incarnation_is_refused_and_ranks_of_one_job_never_fence_each_other(tmp_path):
    directory = str(tmp_path)
    _ended_groups(directory, 3)
    leader = Consumer(directory, "trainer")
    rank = Consumer(directory, "trainer", join=leader.incarnation)   # rank 1 joins rank 0's start
    mine, theirs = leader.take(1, group_size=4), rank.take(1, group_size=4)
    assert mine and theirs and mine[0].item != theirs[0].item
    rank.ack(theirs, step=1)
    leader.ack(mine, step=1)                         # two live ranks: neither fenced
    leader.commit(1)
    (held,) = leader.take(1, group_size=4)           # taken, then the job restarts
    restarted = Consumer(directory, "trainer")
    assert restarted.incarnation == leader.incarnation + 1
    for late in (lambda: leader.ack([held], step=2), lambda: leader.extend([held]), lambda: leader.release([held]),
                 lambda: rank.take(1, group_size=4), lambda: leader.commit(2)):
        with pytest.raises(Fenced) as refused:
            late()
        assert isinstance(refused.value, LeaseLost) and "fenced" in str(refused.value)
    with pytest.raises(Fenced):
        Consumer(directory, "trainer", join=leader.incarnation)  # a rank of the old job cannot rejoin it
    (again,) = restarted.take(1, group_size=4)
    assert again.item == held.item and again.lease.epoch > held.lease.epoch
    restarted.ack([again], step=2)
    restarted.commit(2)
    assert restarted.counts()["final"] == 12


# -- 2. the loop ends when the run ends -------------------------------------------------------------

def _readme_trainer_code() -> str:
    """The README's recipe, the trainer's part, as written."""
    text = open(os.path.join(CHECKOUT, "README.md"), encoding="utf-8").read()
    section = text.split("## Recipe: an async trainer", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    imports = code.split("\n", 1)[0]
    trainer = code.split("# The trainer", 1)[1].split("\n", 1)[1]
    # The user's own functions (load_checkpoint, save_checkpoint, train) are the test's.
    return imports + "\n" + "\n".join(line for line in trainer.splitlines() if not line.startswith("def "))


@pytest.mark.slow
def test_the_readmes_loop_trains_every_rollout_and_ends_only_after_the_runs_end(tmp_path):
    """A runner ends 24 rollouts (groups of 4) over about 20 s with pauses longer than a take's
    wait, then ends the run; the README's loop, run as written, trains each once and exits only
    after the run's end."""
    directory = str(tmp_path)
    expected, run_ended_at = [], []

    def runner() -> None:
        for task in range(6):
            for member in range(4):
                rollout_id = f"task{task}-{member}"
                end_rollout(directory, rollout_id, outcome={"reward": float(member)}, allow_empty=True)
                expected.append(rollout_id)
                time.sleep(0.4)
            time.sleep(1.8)                          # longer than the loop's take waits
        run_ended_at.append(time.time())
        end_run(directory)

    thread = threading.Thread(target=runner)
    thread.start()
    checkpoints: list[int] = []
    trained: list[tuple[int, str, float]] = []

    def train(batch):
        trained.extend((len(checkpoints) + 1, rollout.rollout_id, rollout.outcome["reward"])
                       for item in batch for rollout in getattr(item, "rollouts", [item]))

    namespace = {"load_checkpoint": lambda: 0, "save_checkpoint": checkpoints.append, "train": train}
    code = _readme_trainer_code().replace("/data/model-calls", directory)
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 -- the documented recipe, run as written
    finished_at = time.time()
    thread.join()
    assert run_ended_at and finished_at >= run_ended_at[0], "the loop ended only after the run's end"
    assert sorted(rollout_id for _, rollout_id, _ in trained) == sorted(expected), "every rollout, once"
    assert checkpoints == sorted(checkpoints) and len(checkpoints) >= 2
    assert consumer_view(directory, "trainer").counts()["final"] == 24


def test_after_the_runs_end_a_short_group_is_handed_out_partial_at_once(tmp_path):
    directory = str(tmp_path)
    end_rollout(directory, "7-0", allow_empty=True)
    end_rollout(directory, "7-1", allow_empty=True)
    trainer = Consumer(directory, "trainer")         # straggler bound: 600 s
    assert trainer.take(5, group_size=4) == [] and not trainer.run_over()
    end_run(directory, {"steps": 1})
    (group,) = trainer.take(5, group_size=4)
    assert group.partial and group.missing == ["7-2", "7-3"]
    assert not trainer.run_over(), "leased: not over"
    trainer.ack([group])
    assert trainer.run_over()
    assert list(trainer.batches(5, group_size=4, wait=0.1)) == []


def test_a_member_that_ends_after_its_group_went_partial_is_handed_out_on_its_own_and_the_loop_ends(tmp_path):
    """A group handed out partial at the run's end, then its last member ends (a late runner): the
    member is handed out alone, as a partial group naming who went before, and `batches` ends --
    never a take that waits for it for good."""
    directory = str(tmp_path)
    end_rollout(directory, "7-0", allow_empty=True)
    end_run(directory)
    trainer = Consumer(directory, "trainer")
    (group,) = trainer.take(5, group_size=2)
    assert [r.rollout_id for r in group.rollouts] == ["7-0"] and group.partial and group.missing == ["7-1"]
    trainer.ack([group])
    end_rollout(directory, "7-1", allow_empty=True)
    assert not trainer.run_over()
    (late,) = trainer.take(5, group_size=2)
    assert [r.rollout_id for r in late.rollouts] == ["7-1"] and late.partial and late.missing == ["7-0"]
    assert late.group == "7"
    trainer.ack([late])
    assert trainer.run_over() and trainer.counts()["final"] == 2
    assert list(trainer.batches(5, group_size=2, wait=0.1)) == []


@pytest.mark.slow
async def test_after_the_runs_end_a_group_waits_for_a_member_whose_call_is_in_flight(http, upstream, start, capture_dir):
    """The run's end hands a short group out at once only when no member is on its way: a member
    that ended with a call in flight holds its group (as it holds itself), then it goes whole,
    that member ``incomplete`` past the bound. (Seen in the trainer-agreement tier: the run's end
    said 1 ms after the last rollout's end, its group handed out partial without it, for good.)"""
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM[:200], ending="hang", hang_for=12.0)
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, lambda: end_rollout(capture_dir, "9-0", allow_empty=True))
    call = asyncio.ensure_future(fetch(http, "POST", rollout_url(sidecar.url, "9-1", CHAT), CHAT_REQUEST))
    await asyncio.sleep(0.3)
    await loop.run_in_executor(None, lambda: end_rollout(capture_dir, "9-1", wait_seconds=0.3))
    await loop.run_in_executor(None, end_run, capture_dir)
    trainer = Consumer(capture_dir, "trainer", in_flight_bound_seconds=3.0)
    assert await loop.run_in_executor(None, lambda: trainer.take(5, group_size=2)) == [], "9-1 is on its way"
    (group,) = await loop.run_in_executor(None, lambda: trainer.take(5, group_size=2, wait=6.0))
    assert sorted(r.rollout_id for r in group.rollouts) == ["9-0", "9-1"] and not group.partial
    assert [r.rollout_id for r in group.rollouts if r.incomplete] == ["9-1"]
    call.cancel()


# -- 3. an end names a real rollout -----------------------------------------------------------------

@pytest.mark.slow
async def test_a_typod_end_is_refused_and_its_group_is_handed_out_partial_naming_the_unended_member(
        http, upstream, start, capture_dir):
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    sidecar = await start(upstream.url, capture_dir=capture_dir, admin_token="runner-token")
    runner = {"Authorization": "Bearer runner-token"}
    for rollout_id in ("typo-r0", "typo-r1"):
        assert (await fetch(http, "POST", rollout_url(sidecar.url, rollout_id, CHAT), CHAT_JSON_REQUEST)).status == 200
    body = {"outcome": {"reward": 1.0}, "group": "typo", "group_size": 2}
    assert (await fetch(http, "POST", f"{sidecar.url}/-/rollouts/typo-r0/end", orjson.dumps(body),
                        headers=runner)).status == 200
    typo = await fetch(http, "POST", f"{sidecar.url}/-/rollouts/typo-rl/end", orjson.dumps(body), headers=runner)
    assert typo.status == 404, typo.body
    assert orjson.loads(typo.body)["code"] == "unknown_rollout" and "typo-rl" in orjson.loads(typo.body)["error"]
    assert read_rollout_end(capture_dir, "typo-rl") is None
    loop = asyncio.get_running_loop()  # (ended and taken on a thread: the sidecar runs on this loop)
    with pytest.raises(UnknownRollout):
        await loop.run_in_executor(None, lambda: end_rollout(capture_dir, "typo-rl", outcome={"reward": 1.0},
                                                             group="typo", group_size=2))
    trainer = Consumer(capture_dir, "trainer", straggler_seconds=5.0, unended_seconds=0.0)  # (margin for a busy CI)
    assert await loop.run_in_executor(None, trainer.take, 4) == [], "short of a member: waits for it"
    assert trainer.unended() == {"typo": ["typo-r1"]} and trainer.counts()["unended"] == 1
    await asyncio.sleep(5.1)
    (group,) = await loop.run_in_executor(None, trainer.take, 4)
    assert group.partial and group.missing == ["typo-r1"], "partial, naming who is missing, never a ghost"
    assert [rollout.rollout_id for rollout in group.rollouts] == ["typo-r0"]
    # A rollout that really made no call is ended when the end says so.
    empty = await fetch(http, "POST", f"{sidecar.url}/-/rollouts/no-calls/end", b'{"allow_empty": true}', headers=runner)
    assert empty.status == 200 and orjson.loads(empty.body)["calls"] == 0


# -- 4. one write barrier, whichever way the end came ------------------------------------------------

@pytest.mark.slow
async def test_a_call_in_flight_at_end_rollout_is_whole_in_the_rollout_as_with_the_http_end(
        http, upstream, start, capture_dir):
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM, ending="hang", hang_for=1.0)
    sidecar = await start(upstream.url, capture_dir=capture_dir, admin_token="runner-token")
    shapes = {}
    for how in ("python", "http"):
        rollout_id = f"barrier-{how}"
        assert (await fetch(http, "POST", rollout_url(sidecar.url, rollout_id, CHAT), CHAT_REQUEST)).status == 200
        call = asyncio.ensure_future(fetch(http, "POST", rollout_url(sidecar.url, rollout_id, CHAT), CHAT_REQUEST))
        await asyncio.sleep(0.3)                     # the second call is in flight
        if how == "python":
            end = await asyncio.get_running_loop().run_in_executor(
                None, lambda rollout_id=rollout_id: end_rollout(capture_dir, rollout_id, outcome={"reward": 1.0}))
        else:
            answer = await fetch(http, "POST", f"{sidecar.url}/-/rollouts/{rollout_id}/end",
                                 b'{"outcome": {"reward": 1.0}}', headers={"Authorization": "Bearer runner-token"})
            end = read_rollout_end(capture_dir, rollout_id)
            assert answer.status == 200
        assert call.done() and (await call).status == 200, "the end waited for the call in flight"
        assert end.calls == 2
        trainer = Consumer(capture_dir, f"trainer-{how}")  # (taken on a thread: the sidecar runs on this loop)
        (taken,) = await asyncio.get_running_loop().run_in_executor(None, lambda trainer=trainer: trainer.take(1, wait=3.0))
        assert not taken.incomplete and len(taken.calls) == 2
        shapes[how] = (len(taken.calls), taken.trajectories.model_dump(exclude={"rollout_id", "links"}),
                       taken.trajectories.masked)
    assert shapes["python"] == shapes["http"], "both ends give the same rollout"


@pytest.mark.slow
async def test_a_call_that_never_finishes_holds_its_rollout_back_then_it_is_handed_out_incomplete(
        http, upstream, start, capture_dir):
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM[:200], ending="hang", hang_for=12.0)
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    call = asyncio.ensure_future(fetch(http, "POST", rollout_url(sidecar.url, "stuck", CHAT), CHAT_REQUEST))
    await asyncio.sleep(0.3)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, lambda: end_rollout(capture_dir, "stuck", wait_seconds=0.3))
    trainer = Consumer(capture_dir, "trainer", in_flight_bound_seconds=3.0)
    assert await loop.run_in_executor(None, trainer.take) == [], "held back: a call is in flight"
    (taken,) = await loop.run_in_executor(None, lambda: trainer.take(1, wait=6.0))
    assert taken.incomplete and "in flight" in taken.incomplete_reason
    call.cancel()


def test_mcc_consumers_before_any_take_says_what_waits_and_names_unended_rollouts_and_side_calls(tmp_path):
    from click.testing import CliRunner

    from proxy import main
    from records import CaptureStore

    directory = str(tmp_path)
    store = CaptureStore(directory)  # A writer without the sidecar: its starts are indexed as the sidecar's are.
    for rollout_id in ("7-0", "7-1", "7-2"):
        store.record(rollout_id, {"model_call_id": "a" * 32, "dialect": "chat", "status_code": 200})
        if rollout_id == "7-1":
            store.record(rollout_id, {"model_call_id": "b" * 32, "dialect": "chat", "status_code": 200,
                                      "side_call": {"reason": "title"}})
    end_rollout(directory, "7-0")
    end_rollout(directory, "7-1")
    said = CliRunner().invoke(main, ["consumers", directory, "--unended-after", "0"], prog_name="mcc")
    assert said.exit_code == 0, said.output
    first, run = said.output.splitlines()
    assert first.startswith("no consumer has taken anything from") and "2 ended rollout(s) wait" in first
    assert run.startswith("run: going on; 2 rollout(s) ended, 1 unended") and "7: 7-2" in run and "1 side call(s)" in run
    end_run(directory)
    (run_json,) = map(json_loads, CliRunner().invoke(main, ["consumers", directory, "--json", "--unended-after", "0"],
                                                     prog_name="mcc").output.splitlines())
    assert run_json["run"]["run_ended_at"] and run_json["run"]["unended"] == {"7": ["7-2"]}


def json_loads(text: str):
    return orjson.loads(text)


async def test_the_sidecar_counts_rollouts_that_made_calls_and_never_ended(http, upstream, start, capture_dir):
    from tests.proxy.app.test_metrics_and_logs import scrape, value
    from tests.wire import RUNNER

    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    server = await start(upstream.url, capture_dir=capture_dir)
    server.sidecar.feature(RolloutEndsFeature).ended.unended_after = 0.2  # (300 s by default)
    for rollout_id in ("kept-0", "kept-1", "kept-2"):
        assert (await fetch(http, "POST", rollout_url(server.url, rollout_id, CHAT), CHAT_JSON_REQUEST)).status == 200
    assert (await fetch(http, "POST", f"{server.url}/-/rollouts/kept-0/end", b"", headers=RUNNER)).status == 200
    await asyncio.sleep(0.5)  # Idle past the bound (published as idle within 0.1 s).
    await asyncio.get_running_loop().run_in_executor(None, lambda: end_rollout(capture_dir, "kept-1"))
    assert value(await scrape(http, server), "mcc_rollouts_unended") == 1, "kept-2: calls, no end"


@pytest.mark.slow
async def test_a_rollout_read_while_its_call_is_in_flight_says_so_not_lost(http, upstream, start, capture_dir):
    from records import trajectories
    from tests.proxy.training.test_token_files import SYSTEM, converse
    from tests.scripted_upstream import Script
    from tests.vllm_chat_model import TinyChatModel

    model = TinyChatModel()

    def respond(received):
        request = orjson.loads(received.body)
        reply = model.body(request)
        slow = request["messages"][-1]["content"] == "more"  # The second turn takes its time.
        return Script(headers=[("Content-Type", "application/json"), ("Content-Length", str(len(reply)))],
                      pieces=[reply], delay_head=1.5 if slow else 0.0)

    upstream.responder = respond
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    (first,) = await converse(http, sidecar, "slow", ["hi"])
    messages = [SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": first["content"]},
                {"role": "user", "content": "more"}]
    call = asyncio.ensure_future(fetch(http, "POST", rollout_url(sidecar.url, "slow", CHAT),
                                       orjson.dumps({"model": "m", "messages": messages})))
    await asyncio.sleep(0.6)
    during = await asyncio.get_running_loop().run_in_executor(None, trajectories, capture_dir, "slow")
    assert during.masked and during.mask_reason.startswith("call in flight"), during.mask_reason
    assert (await call).status == 200
    after = trajectories(capture_dir, "slow")
    assert not after.masked and len(after.main.calls) == 2


@pytest.mark.slow
async def test_on_a_store_a_call_in_flight_at_the_end_holds_its_rollout_until_its_line_ships(
        http, upstream, start, tmp_path, monkeypatch):
    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    store = f"segments://{tmp_path / 'store'}"
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM, ending="hang", hang_for=2.5)
    sidecar = await start(upstream.url, capture_dir=str(tmp_path / "spool"), capture_store=store, segment_max_age=0.2)
    loop = asyncio.get_running_loop()
    assert (await fetch(http, "POST", rollout_url(sidecar.url, "held", CHAT), CHAT_REQUEST)).status == 200
    call = asyncio.ensure_future(fetch(http, "POST", rollout_url(sidecar.url, "held", CHAT), CHAT_REQUEST))
    await asyncio.sleep(0.3)
    await loop.run_in_executor(None, lambda: end_rollout(store, "held", outcome={"reward": 1.0}))
    trainer = Consumer(store, "trainer")
    early = await loop.run_in_executor(None, lambda: trainer.take(1, wait=1.0))
    assert early == [], "held back while its call is in flight"
    assert (await call).status == 200
    (taken,) = await loop.run_in_executor(None, lambda: trainer.take(1, wait=15.0))
    assert len(taken.calls) == 2 and not taken.incomplete, "whole: the call in flight at the end is in it"


@pytest.mark.slow
def test_on_a_store_an_end_finds_its_rollout_in_a_spool_or_uploaded_and_a_typo_is_refused(tmp_path, monkeypatch):
    """Two sidecar processes on one store: a rollout whose lines wait in one sidecar's spool is
    found by an end sent to the other (the writer's pending list), one whose lines shipped by its
    marker; a typo'd id is refused there and from Python; the rollout with calls and no end reads
    as unended from the store."""
    import urllib.error
    import urllib.request

    from tests.processes import SidecarProcess, post_chat
    from tests.wire import RUNNER, RUNNER_TOKEN

    store = f"segments://{tmp_path / 'store'}"
    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    env = {"MCC_STORE_CACHE": str(tmp_path / "cache"), "MCC_ADMIN_TOKEN": RUNNER_TOKEN}
    holding = SidecarProcess.start("--stand-in", "--capture-dir", str(tmp_path / "spool-a"), "--capture-store", store,
                                   "--segment-max-age", "30", env=env)
    other = SidecarProcess.start("--stand-in", "--capture-dir", str(tmp_path / "spool-b"), "--capture-store", store,
                                 "--segment-max-age", "30", env=env)

    def end(sidecar, rollout_id: str, body: bytes = b"") -> int:
        request = urllib.request.Request(f"{sidecar.url}/-/rollouts/{rollout_id}/end", data=body, method="POST",
                                         headers=RUNNER)
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return reply.status
        except urllib.error.HTTPError as error:
            return error.code

    try:
        for rollout_id in ("spooled-0", "spooled-1", "left-2"):
            assert post_chat(holding.url, rollout_id)[0] == 200
        assert end(other, "spooled-0") == 200, "its lines are in the other sidecar's spool: found there"
        assert end(other, "spooled-9") == 404, "a typo"
        with pytest.raises(UnknownRollout):
            end_rollout(store, "spooled-9")
        assert end(other, "spooled-9", b'{"allow_empty": true}') == 200
        assert holding.terminate() == 0  # Drained: its spool shipped, the markers put.
        holding = None
        assert end_rollout(store, "spooled-1").rollout_id == "spooled-1", "found by its marker"
        trainer = Consumer(store, "trainer", unended_seconds=0.0)
        assert trainer.unended() == {"left": ["left-2"]}
    finally:
        for sidecar in (holding, other):
            if sidecar is not None:
                sidecar.terminate()
