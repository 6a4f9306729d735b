"""NeMo Gym 0.7.0's own readers on a compacted capture store (issue 46, point 4): a sidecar writes
writer segments to a store; `mcc compact`'s library call writes Gym's per-rollout files; Gym's
`read_model_call_records`, `aggregate_model_call_metrics` and `merge_model_call_capture_into_record`
read them, and agree field by field with `records` reading the store URL itself."""

from __future__ import annotations

import pytest

import asyncio

from records import CaptureStore, read_model_call_records
from records.store import compact_store
from tests.scripted_upstream import json_script, sse_script
from tests.transcripts import CHAT_JSON, CHAT_JSON_REQUEST, RESPONSES_REQUEST, RESPONSES_STREAM
from tests.wire import fetch, rollout_url

from .agreement import compare_rollout, run_gym


@pytest.mark.slow
async def test_gyms_readers_on_a_compacted_store_agree_with_records_on_the_store(http, upstream, start, tmp_path, gym,
                                                                                monkeypatch):
    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    url = f"segments://{tmp_path}/store"
    upstream.scripts["/v1/chat/completions"] = json_script(CHAT_JSON)
    upstream.scripts["/v1/responses"] = sse_script(RESPONSES_STREAM)
    sidecar = await start(upstream.url, capture_dir=str(tmp_path / "spool"), capture_store=url, segment_max_age=0.1,
                          model_name="test-model")
    sent = {"s-chat": 3, "s-responses": 2}
    for _ in range(3):
        await fetch(http, "POST", rollout_url(sidecar.url, "s-chat", "/v1/chat/completions"), CHAT_JSON_REQUEST)
    for _ in range(2):
        await fetch(http, "POST", rollout_url(sidecar.url, "s-responses", "/v1/responses"), RESPONSES_REQUEST)
    for _ in range(200):  # Sealed at 0.1 s, then uploaded.
        if all(len(read_model_call_records(CaptureStore(url, allow_empty=True), rollout)) == count
               for rollout, count in sent.items()):
            break
        await asyncio.sleep(0.05)
    view = compact_store(url, str(tmp_path / "gym-view"))
    theirs = run_gym(gym, view, *sent)
    compared, unexplained = 0, []
    for rollout_id, count in sent.items():
        assert len(theirs[rollout_id]["records"]) == count
        counts = compare_rollout(CaptureStore(url), rollout_id, theirs[rollout_id])
        compared, unexplained = compared + counts[0], unexplained + counts[1]
    assert compared > 50 and unexplained == []


async def test_gyms_token_readers_on_a_compacted_store_build_the_chain(http, upstream, start, tmp_path, gym,
                                                                      monkeypatch):
    """The token capture mode with a capture store: the spool's training-token files are shipped
    with the segments; on the compacted view Gym's `TokenCaptureStore.freeze_now` and
    `trajectories_for_rollout` build one unmasked chain, as `records.trajectories` does on the URL
    and as both do on the same rollout written to a plain capture dir."""
    from records import trajectories
    from tests.gym_conformance.test_gym_reads_token_files import assert_ours_equal_gyms
    from tests.gym_conformance.test_gym_reads_token_files import run_gym as run_gym_tokens
    from tests.proxy.training.test_token_files import converse, serve_model
    from tests.vllm_chat_model import TinyChatModel

    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    url = f"segments://{tmp_path}/store"
    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=str(tmp_path / "spool"), capture_store=url, capture_tokens=True,
                          segment_max_age=0.1)
    plain = await start(upstream.url, capture_dir=str(tmp_path / "plain"), capture_tokens=True)
    for target in (sidecar, plain):
        await converse(http, target, "clean", ["hi", "more", "thanks"])
    await sidecar.close()  # The drain seals, uploads and ships the token files.
    view = compact_store(url, str(tmp_path / "gym-view"))
    theirs = run_gym_tokens(gym, view, "clean")["clean"]
    assert theirs["mask"] is False and theirs["error"] is None and len(theirs["entries"]) == 3, theirs
    assert_ours_equal_gyms(view, "clean", theirs)
    ours = trajectories(url, "clean")
    assert not ours.masked and ours.main.token_ids == trajectories(str(tmp_path / "plain"), "clean").main.token_ids
    assert run_gym_tokens(gym, str(tmp_path / "plain"), "clean")["clean"]["generations"] == theirs["generations"]



async def test_gyms_token_readers_link_a_rollout_re_pinned_across_two_sidecars(http, upstream, start, tmp_path, gym,
                                                                             monkeypatch):
    """A router re-pins a rollout: turns 1-2 through one sidecar, turn 3 through another, each with
    its own spool. The second could not resolve turn 3 (the first's calls are in the other spool);
    the store's view links it to turn 2, so Gym's `trajectories_for_rollout` builds one unmasked
    3-turn chain, the one both build for the same conversation through one sidecar."""
    import orjson

    from records import trajectories
    from tests.gym_conformance.test_gym_reads_token_files import assert_ours_equal_gyms
    from tests.gym_conformance.test_gym_reads_token_files import run_gym as run_gym_tokens
    from tests.proxy.training.test_token_files import SYSTEM, converse, serve_model
    from tests.vllm_chat_model import TinyChatModel

    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    url = f"segments://{tmp_path}/store"
    serve_model(upstream, TinyChatModel())
    sidecars = [await start(upstream.url, capture_dir=str(tmp_path / f"spool-{i}"), capture_store=url,
                            capture_tokens=True, segment_max_age=0.1) for i in range(2)]
    plain = await start(upstream.url, capture_dir=str(tmp_path / "plain"), capture_tokens=True)
    await converse(http, plain, "pinned", ["hi", "more", "thanks"])
    messages = [SYSTEM]
    for turn, text in enumerate(["hi", "more", "thanks"]):
        messages.append({"role": "user", "content": text})
        target = sidecars[0] if turn < 2 else sidecars[1]
        reply = await fetch(http, "POST", rollout_url(target.url, "pinned", "/v1/chat/completions"),
                            orjson.dumps({"model": "m", "messages": messages}))
        assert reply.status == 200
        messages.append({"role": "assistant", "content": orjson.loads(reply.body)["choices"][0]["message"]["content"]})
    for sidecar in sidecars:
        await sidecar.close()
    view = compact_store(url, str(tmp_path / "gym-view"))
    theirs = run_gym_tokens(gym, view, "pinned")["pinned"]
    assert theirs["mask"] is False and theirs["error"] is None and len(theirs["entries"]) == 3, theirs
    assert_ours_equal_gyms(view, "pinned", theirs)
    assert run_gym_tokens(gym, str(tmp_path / "plain"), "pinned")["pinned"]["generations"] == theirs["generations"]
    ours = trajectories(url, "pinned")
    assert not ours.masked and ours.main.token_ids == trajectories(str(tmp_path / "plain"), "pinned").main.token_ids

def test_records_sums_latencies_as_gyms_interpreter_does(gym):
    """`records`' sums of latencies equal, to the bit, what Gym's own interpreter's ``sum`` gives
    (3.12+: compensated), for 2,000 random lists of latencies rounded as lines round them."""
    import json
    import random
    import subprocess

    from tests.records.store.test_gym_parity import latency_total
    rng = random.Random(7)
    lists = [[round(rng.uniform(0.1, 900.0), 3) for _ in range(rng.randint(2, 40))] for _ in range(2000)]
    done = subprocess.run([gym, "-c", "import json, sys; print(json.dumps([sum(v) for v in json.load(sys.stdin)]))"],
                          input=json.dumps(lists), capture_output=True, text=True, check=True)
    assert [latency_total(values) for values in lists] == json.loads(done.stdout)
