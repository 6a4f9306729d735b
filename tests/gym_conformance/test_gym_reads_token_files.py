"""NeMo Gym 0.7.0 reads the training-token files the sidecar writes (issue 31, point 1): its own
``TokenCaptureStore(dir).freeze_now`` takes the snapshot and ``consumer.trajectories_for_rollout``
builds the chain (``prefix_merging``), in Gym's venv, on files written through an agent loop."""

from __future__ import annotations

import json
import subprocess

import orjson
import pytest

from records import read_token_entries
from tests.test_token_files import SYSTEM, converse, serve_model
from tests.vllm_chat_model import TinyChatModel

from .gym_venv import GymUnavailable, gym_python

_GYM_SCRIPT = """
import json, sys
from pathlib import Path
from nemo_gym.token_id_capture.store import TokenCaptureStore
from nemo_gym.token_id_capture.consumer import trajectories_for_rollout
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
    }
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def gym() -> str:
    try:
        return gym_python()
    except GymUnavailable as exc:
        pytest.skip(f"NeMo Gym 0.7.0 is not available here: {exc}")


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
