"""Token-in/token-out calls (vLLM's ``/inference/v1/generate``) in the training-token files
(docs/tokens.md): the arrays are explicit, so nothing is added to the request or cut from the reply;
each call's entry is written from them, and its parent is the call whose whole sequence its prompt
begins with (`RolloutLineage.resolve_tokens`), so a rollout's turns are one chain stored once."""

from __future__ import annotations

import orjson
import pytest

from records import read_token_entries, trajectories
from records.contract import RolloutLineage, TokenFiles
from records.contract.writing import token_entry
from records.contract.reading import token_digest
from tests.wire import fetch, rollout_url

SYSTEM_PROMPT = [101, 7, 4242, 9, 15]


def _body(prompt: list[int], stream: bool) -> bytes:
    body = {"token_ids": prompt, "sampling_params": {"max_tokens": 4, "logprobs": 0}}
    if stream:
        body |= {"stream": True}
    return orjson.dumps(body)


def _generated(reply: bytes, stream: bool) -> list[int]:
    if not stream:
        return orjson.loads(reply)["choices"][0]["token_ids"]
    ids: list[int] = []
    for event in reply.split(b"\n\n"):
        data = event.removeprefix(b"data: ")
        if data and data != b"[DONE]":
            for choice in orjson.loads(data)["choices"]:
                ids += choice.get("token_ids") or []
    return ids


async def _turn(http, stand_in, sidecar, rollout_id: str, prompt: list[int], stream: bool) -> list[int]:
    """One call through the sidecar, its bytes checked against the same call made directly."""
    body = _body(prompt, stream)
    direct = await fetch(http, "POST", stand_in.url + "/inference/v1/generate", body)
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, rollout_id, "/inference/v1/generate"), body)
    assert (proxied.status, proxied.body) == (direct.status, direct.body), "the agent's bytes are the upstream's"
    return _generated(proxied.body, stream)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_token_in_conversation_is_one_chain_stored_once(http, stand_in, start, capture_dir, store, stream):
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    prompts, sequence = [], list(SYSTEM_PROMPT)
    for new_turn in ([], [5, 6], [8]):
        sequence += new_turn
        prompts.append(list(sequence))
        sequence += await _turn(http, stand_in, sidecar, "tito", list(sequence), stream)
    entries = read_token_entries(capture_dir, "tito")
    lines = store.read("tito")
    assert [entry["model_call_id"] for entry in entries] == [line["model_call_id"] for line in lines]
    assert [e["parent_resolution"] for e in entries] == ["root", "resolved", "resolved"]
    assert [e["parent_call_id"] for e in entries] == [None, entries[0]["model_call_id"], entries[1]["model_call_id"]]
    assert [e["prompt_token_ids"] for e in entries] == [SYSTEM_PROMPT, [5, 6], [8]], "a child stores only what is new"
    assert entries[-1]["digest"] == token_digest(sequence) and entries[-1]["cum_len"] == len(sequence)
    assert all(line.get("token_entries") is None for line in lines), "nothing was cut: the line is what the agent saw"
    build = trajectories(capture_dir, "tito")
    assert not build.masked, build.mask_reason
    assert build.main is not None and build.main.token_ids == sequence
    generated = [entry["generation_token_ids"] for entry in entries]
    assert [build.main.token_ids[call.start:call.end] for call in build.main.calls] == generated
    assert sum(build.main.loss_mask) == sum(map(len, generated))


async def test_a_prompt_that_continues_nothing_is_a_root_and_a_retry_names_the_first(http, stand_in, start,
                                                                                   capture_dir):
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    first = await _turn(http, stand_in, sidecar, "r", SYSTEM_PROMPT, False)
    await _turn(http, stand_in, sidecar, "r", [999, 5], False)  # Another conversation: no earlier sequence.
    # Two identical calls continuing the first: both resolve to it; the next turn resolves to the first of the two.
    again = [*SYSTEM_PROMPT, *first, 5]
    second = await _turn(http, stand_in, sidecar, "r", again, False)
    await _turn(http, stand_in, sidecar, "r", again, False)
    await _turn(http, stand_in, sidecar, "r", [*again, *second, 6], False)
    entries = read_token_entries(capture_dir, "r")
    ids = [entry["model_call_id"] for entry in entries]
    assert [(e["parent_resolution"], e["parent_call_id"]) for e in entries] == [
        ("root", None), ("root", None), ("resolved", ids[0]), ("resolved", ids[0]), ("resolved", min(ids[2], ids[3]))]


async def test_a_request_vllm_refuses_gets_no_entry_and_goes_as_it_came(http, stand_in, start, capture_dir):
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    body = orjson.dumps({"token_ids": [], "sampling_params": {}})
    direct = await fetch(http, "POST", stand_in.url + "/inference/v1/generate", body)
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "bad", "/inference/v1/generate"), body)
    assert (proxied.status, proxied.body) == (direct.status, direct.body) and direct.status == 400
    assert read_token_entries(capture_dir, "bad") == []
    assert TokenFiles(capture_dir).intents("bad") == [], "no intent: no entry was to be written"


def _entry(call_id: str, prompt: list[int], generated: list[int], parent: str | None = None,
           parent_sequence: list[int] | None = None) -> dict:
    return token_entry(rollout_id="u", model_call_id=call_id, model="m", prompt_token_ids=prompt,
                       generation_token_ids=generated, generation_log_probs=[-0.5] * len(generated), items=[],
                       response_id=None, created_at=0.0, request=[], parent_call_id=parent,
                       parent_resolution="resolved" if parent else "root", reason="",
                       parent_sequence=parent_sequence)


def test_the_longest_earlier_sequence_wins_and_an_entry_without_tokens_of_its_own_is_still_found(tmp_path):
    files = TokenFiles(str(tmp_path))
    files.append(_entry("a", [1, 2], [3]))
    files.append(_entry("b", [1, 2, 3, 4], [5, 6], "a", [1, 2, 3]))
    files.append(_entry("c", [1, 2, 3, 4, 5, 6], [], "b", [1, 2, 3, 4, 5, 6]))  # Stores no token of its own.
    lineage = RolloutLineage(files, "u")
    lineage.refresh()
    assert lineage.resolve_tokens([1, 2, 3, 4, 5, 6, 7]).parent_call_id == "b", "c and b end alike: the first id"
    assert lineage.resolve_tokens([1, 2, 3, 9]).parent_call_id == "a"
    assert lineage.resolve_tokens([1, 2, 3]).parent_sequence == [1, 2, 3], "a prompt that is a whole sequence"
    assert lineage.resolve_tokens([1, 2]).status == "root"
    assert lineage.resolve_tokens([7, 2, 3, 4, 5, 6]).status == "root", "same length and last token, other tokens"
