"""NeMo Gym 0.7.0 reads the training-token files the sidecar writes (issue 31, point 1): its own
``TokenCaptureStore(dir).freeze_now`` (found where the installed Gym keeps it: `gym_token_capture`) takes the snapshot and ``consumer.trajectories_for_rollout``
builds the chain (``prefix_merging``), in Gym's venv, on files written through an agent loop."""

from __future__ import annotations

import json
import subprocess

import orjson
import pytest

from records import read_token_entries
from tests.gym_conformance.gym_token_capture import FINDER
from tests.conformance.vllm_recordings import CASES_BY_NAME, Replay, normalised, requires_vllm_recordings
from tests.scripted_upstream import json_script
from tests.wire import fetch, rollout_url
from tests.proxy.training.test_token_files import SYSTEM, converse, serve_model
from tests.vllm_chat_model import TinyChatModel


_GYM_SCRIPT = FINDER + """
import json, sys
from pathlib import Path
TokenCaptureStore = gym_token_capture("store").TokenCaptureStore
trajectories_for_rollout = gym_token_capture("consumer").trajectories_for_rollout
directory, rollouts = sys.argv[1], sys.argv[2:]
out = {}
for rollout in rollouts:
    snapshot = TokenCaptureStore(directory).freeze_now(rollout)
    built = trajectories_for_rollout(rollout, [Path(directory)])
    response = built.get("rebuilt_response") or {}
    generated = [item for item in response.get("output", []) if item.get("generation_token_ids") is not None]
    out[rollout] = {
        "entries": [entry.model_call_id for entry in snapshot.entries],
        "incomplete": snapshot.incomplete,
        "mask": built["mask_sample"],
        "error": built.get("error"),
        "prompts": [item["prompt_token_ids"] for item in generated],
        "generations": [item["generation_token_ids"] for item in generated],
        "logprobs": [item["generation_log_probs"] for item in generated],
        "metrics": {key: built.get("metrics", {}).get(key) for key in ("chains", "roots", "quarantined_calls",
                                                                       "parent_link_failures", "unresolved_parent_calls")},
        "unresolved_retries": built.get("unresolved_retries"),
    }
print(json.dumps(out))
"""



def run_gym(gym: str, directory: str, *rollouts: str) -> dict:
    done = subprocess.run([gym, "-c", _GYM_SCRIPT, directory, *rollouts], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


async def test_gym_builds_our_chain_and_masks_what_it_must(gym, http, upstream, start, capture_dir, store):
    """A clean 3-turn rollout: one unmasked chain whose items' prompts and generations are the
    model's, delta prompts rebuilt by Gym. A drifting rollout and one with a lost call: masked."""
    model = TinyChatModel()
    serve_model(upstream, model)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    await converse(http, sidecar, "clean", ["hi", "more", "thanks"])
    drifting = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    serve_model(upstream, TinyChatModel(drop_assistant_turns=True))
    await converse(http, drifting, "drift", ["hi", "more"])
    serve_model(upstream, model)
    await converse(http, sidecar, "lost", ["hi"])
    upstream.responder = None  # The next call's upstream answers 404: no entry, its intent dangles.
    await converse_failing(http, sidecar, "lost")

    built = run_gym(gym, capture_dir, "clean", "drift", "lost")
    clean = built["clean"]
    entries = read_token_entries(capture_dir, "clean")
    assert clean["entries"] == [e["model_call_id"] for e in entries] and not clean["incomplete"]
    assert clean["mask"] is False and clean["error"] is None, clean
    requests = [line["request"]["messages"] for line in store.read("clean")]
    assert clean["prompts"] == [model.render(messages) for messages in requests]
    assert clean["generations"] == [[*(100 + ord(c) for c in f"reply {turn}"), 0] for turn in (1, 2, 3)]
    assert clean["logprobs"][0] == [-0.125 * (i + 1) for i in range(len("reply 1") + 1)]
    assert clean["metrics"]["chains"] == 1 and clean["metrics"]["quarantined_calls"] == 0

    assert built["drift"]["mask"] is True, built["drift"]
    assert built["lost"]["incomplete"] is True and built["lost"]["mask"] is True


async def converse_failing(http, sidecar, rollout: str) -> None:
    from tests.wire import fetch, rollout_url
    reply = await fetch(http, "POST", rollout_url(sidecar.url, rollout, "/v1/chat/completions"),
                        orjson.dumps({"model": "m", "messages": [SYSTEM, {"role": "user", "content": "x"}]}))
    assert reply.status == 404


async def test_gym_builds_a_call_of_every_dialect_streamed_or_not(gym, http, stand_in, start, capture_dir):
    """Chat, completions (text and token-id prompts, n = 2) and Responses, streamed and not, through
    the mode against the stand-in: each call's entry is a root Gym builds unmasked, with our arrays;
    n = 2 gives one entry per choice; Messages gets none (vLLM returns no arrays there)."""
    from records import read_token_records
    from tests.proxy.training.test_token_capture_mode import REQUESTS
    from tests.wire import fetch, rollout_url

    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    for case, (path, request) in REQUESTS.items():
        await fetch(http, "POST", rollout_url(sidecar.url, case, path), orjson.dumps(request))
    assert read_token_entries(capture_dir, "messages-stream") == []
    cases = [case for case in REQUESTS if not case.startswith("messages")]
    built = run_gym(gym, capture_dir, *cases)
    for case in cases:
        entries = read_token_entries(capture_dir, case)
        records = read_token_records(capture_dir, case)
        assert len(entries) == len(records) == REQUESTS[case][1].get("n", 1), case
        for entry, record in zip(entries, records):
            assert entry["parent_resolution"] == "root" and not entry["prompt_is_delta"]
            assert (entry["prompt_token_ids"], entry["generation_token_ids"], entry["generation_log_probs"]) == (
                record.prompt_token_ids, record.generation_token_ids, record.generation_log_probs), case
        if len(entries) == 1:
            assert built[case]["mask"] is False, (case, built[case])
            assert built[case]["generations"] == [entries[0]["generation_token_ids"]]
            assert built[case]["prompts"] == [entries[0]["prompt_token_ids"]]
        else:  # Two sibling roots: Gym's strict single-chain policy masks, as it would its own n = 2 call.
            assert built[case]["mask"] is True and built[case]["metrics"]["roots"] == 2


def assert_ours_equal_gyms(directory: str, rollout_id: str, gyms: dict) -> None:
    """`records.trajectories` gives Gym's main chain: the same ids, the generated spans where Gym's
    items put them, the same logprobs, the same verdict and the same build notes."""
    from records import trajectories
    ours = trajectories(directory, rollout_id)
    assert ours.masked == gyms["mask"], (rollout_id, ours.mask_reason, gyms)
    for key in ("chains", "roots", "quarantined_calls", "parent_link_failures"):
        if gyms["metrics"][key] is not None:
            assert ours.notes[key] == gyms["metrics"][key], (rollout_id, key)
    if gyms["metrics"]["unresolved_parent_calls"] is not None:
        assert len(ours.notes["unresolved_parent_calls"]) == gyms["metrics"]["unresolved_parent_calls"], rollout_id
    if not gyms["prompts"]:
        return
    main = ours.main
    last_prompt, last_generation = gyms["prompts"][-1], gyms["generations"][-1]
    assert main.token_ids == last_prompt + last_generation, rollout_id
    spans = [(len(prompt), len(prompt) + len(generation)) for prompt, generation in zip(gyms["prompts"], gyms["generations"])]
    assert [(call.start, call.end) for call in main.calls] == spans
    assert main.loss_mask == [int(any(a <= i < b for a, b in spans)) for i in range(len(main.token_ids))]
    assert [main.logprobs[i] for a, b in spans for i in range(a, b)] == [x for lp in gyms["logprobs"] for x in lp]


async def test_records_trajectories_equal_gyms_builder(gym, http, upstream, stand_in, start, capture_dir):
    """The same files, Gym's builder and ours: a clean chain, a drift, a lost call, a retried final
    turn, a retried middle turn, an unresolved continuation, and single calls of every dialect."""
    from tests.proxy.training.test_token_capture_mode import REQUESTS
    from tests.wire import fetch, rollout_url

    model = TinyChatModel()
    serve_model(upstream, model)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    await converse(http, sidecar, "clean", ["hi", "more", "thanks"])
    url = lambda rollout: rollout_url(sidecar.url, rollout, "/v1/chat/completions")  # noqa: E731
    first = [SYSTEM, {"role": "user", "content": "hi"}]
    second = [*first, {"role": "assistant", "content": "reply 1"}, {"role": "user", "content": "more"}]
    for messages in (first, first):
        await fetch(http, "POST", url("final-retry"), orjson.dumps({"model": "m", "messages": messages}))
    for messages in (first, first, second):
        await fetch(http, "POST", url("middle-retry"), orjson.dumps({"model": "m", "messages": messages}))
    for messages in (first, [*first, {"role": "assistant", "content": "edited"}, {"role": "user", "content": "x"}]):
        await fetch(http, "POST", url("unresolved"), orjson.dumps({"model": "m", "messages": messages}))
    serve_model(upstream, TinyChatModel(drop_assistant_turns=True))
    await converse(http, sidecar, "drift", ["hi", "more"])
    serve_model(upstream, model)
    await converse(http, sidecar, "lost", ["hi"])
    upstream.responder = None
    await converse_failing(http, sidecar, "lost")
    on_stand_in = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    dialects = [case for case in REQUESTS if not case.startswith("messages")]
    for case in dialects:
        path, request = REQUESTS[case]
        await fetch(http, "POST", rollout_url(on_stand_in.url, case, path), orjson.dumps(request))
    rollouts = ["clean", "final-retry", "middle-retry", "unresolved", "drift", "lost", *dialects]
    built = run_gym(gym, capture_dir, *rollouts)
    for rollout_id in rollouts:
        assert_ours_equal_gyms(capture_dir, rollout_id, built[rollout_id])
    # Gym counts a quarantined retry as a root: a retried first turn masks even when a later call
    # names the kept one. Ours says the same, with the reason.
    assert built["middle-retry"]["metrics"]["quarantined_calls"] == 1 and built["final-retry"]["mask"] is True


async def test_an_agent_loop_with_tools_a_retry_and_a_drifting_turn(gym, http, stand_in, start, capture_dir):
    """The stand-in behind the sidecar in the mode, an agent loop as Gym's agents run it: a tool call,
    its result, the answer, a retried turn; then the same loop with one turn under a template that
    drops the model's reasoning. Gym's builder and ours agree on both, call by call."""
    from tests.wire import fetch, rollout_url

    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True, supply_prefix=False)  # The drift shows without supply.
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]

    async def loop(rollout_id: str, drop_on_turn: int | None) -> None:
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        for turn in range(3):
            headers = {"X-Stand-In-Template": "drop-reasoning"} if turn == drop_on_turn else None
            body = orjson.dumps({"model": "m", "messages": messages, "tools": tools})
            reply = await fetch(http, "POST", rollout_url(sidecar.url, rollout_id, "/v1/chat/completions"), body, headers)
            if turn == 1:  # The SDK retried this turn (same body): two calls, one kept.
                reply = await fetch(http, "POST", rollout_url(sidecar.url, rollout_id, "/v1/chat/completions"), body,
                                    {**(headers or {}), "x-stainless-retry-count": "1"})
            message = orjson.loads(reply.body)["choices"][0]["message"]
            messages.append({key: message[key] for key in ("role", "content", "tool_calls") if message.get(key) is not None})
            for call in message.get("tool_calls") or ():
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": "sunny, 22 C"})
            if not message.get("tool_calls"):
                messages.append({"role": "user", "content": "and tomorrow?"})

    await loop("agent", None)
    await loop("agent-drift", 2)
    built = run_gym(gym, capture_dir, "agent", "agent-drift")
    for rollout_id in ("agent", "agent-drift"):
        assert_ours_equal_gyms(capture_dir, rollout_id, built[rollout_id])
    assert built["agent"]["mask"] is False, built["agent"]
    assert built["agent"]["metrics"]["quarantined_calls"] == 1, "the retried turn's other call"
    assert built["agent-drift"]["mask"] is True


@requires_vllm_recordings
async def test_a_tool_call_with_an_integer_beyond_64_bits_keeps_its_entry_and_its_next_turn(
        gym, http, upstream, start, capture_dir):
    """The recorded vLLM 0.32 `chat-tools-bigint` reply (a 145-digit integer in the arguments)
    through the sidecar in the token mode: its entry is written, the next turn, which sends the
    tool call back, resolves to it, and Gym's own store and builder take the rollout unmasked."""
    case = CASES_BY_NAME["chat-tools-bigint"]
    first = orjson.loads(case.added.body)
    prompt, generation = first["prompt_token_ids"], first["choices"][0]["token_ids"]
    # The second turn's reply, shaped as vLLM writes it (the recorded reply's keys, in its order):
    # its prompt extends the first call's prompt + generation, as vLLM's template renders it.
    second = {**first, "id": "chatcmpl-second", "prompt_token_ids": prompt + generation + [11, 12, 13],
              "choices": [{**first["choices"][0],
                           "message": {**first["choices"][0]["message"], "content": "3", "tool_calls": []},
                           "logprobs": {"content": [{"token": "3", "logprob": -0.5, "bytes": [51], "top_logprobs": []},
                                                    {"token": "", "logprob": -0.25, "bytes": [], "top_logprobs": []}]},
                           "finish_reason": "stop", "token_ids": [18, 2]}]}
    replay = Replay()
    upstream.responder = lambda request: replay(request) or json_script(orjson.dumps(second))
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    url = rollout_url(sidecar.url, "big", case.path)
    reply = await fetch(http, "POST", url, case.asked.request)
    assert reply.status == 200 and normalised(reply.body) == normalised(case.asked.body), "the agent's own reply"
    (tool_call,) = orjson.loads(reply.body)["choices"][0]["message"]["tool_calls"]
    request = orjson.loads(case.asked.request)
    request["messages"] += [{"role": "assistant", "content": "", "tool_calls": [tool_call]},
                            {"role": "tool", "tool_call_id": tool_call["id"], "content": "big"}]
    assert (await fetch(http, "POST", url, orjson.dumps(request))).status == 200

    entries = read_token_entries(capture_dir, "big")
    assert len(entries) == 2, "each turn has its training entry"
    assert entries[1]["parent_call_id"] == entries[0]["model_call_id"], "the next turn resolves to the tool call"
    built = run_gym(gym, capture_dir, "big")["big"]
    assert built["entries"] == [entry["model_call_id"] for entry in entries] and not built["incomplete"]
    assert built["mask"] is False and built["error"] is None, built
    assert built["generations"] == [generation, [18, 2]] and built["metrics"]["chains"] == 1, built


@pytest.mark.parametrize("stream", [False, True])
async def test_gym_builds_a_sglang_rollouts_chain(gym, http, start, capture_dir, stream):
    """Issue 57: a rollout against SGLang (its ``sglext`` ids, cut from the agent's bytes) writes
    the entries Gym's own `trajectories_for_rollout` builds into one unmasked chain, ours alike."""
    from proxy.standin import start_stand_in
    from tests.proxy.training.test_sglang_tokens import _turns

    sglang = await start_stand_in(engine="sglang")
    try:
        sidecar = await start(sglang.url, capture_dir=capture_dir, capture_tokens=True, engine="sglang")
        await _turns(http, sglang.url, sidecar, "sglang", stream)
    finally:
        await sglang.close()
    theirs = run_gym(gym, capture_dir, "sglang")["sglang"]
    assert theirs["mask"] is False and theirs["error"] is None and len(theirs["entries"]) == 3, theirs
    assert_ours_equal_gyms(capture_dir, "sglang", theirs)
