"""MoE routed experts in the token capture mode (``--capture-routed-experts``, docs/tokens.md): each
call's ``routed_experts`` (vLLM's base64 ``.npy``, a row per token read but the last) stored apart
as an object named by its sha256, only the rows its parent's entry does not hold; the entry and
the line name it; readers give them back aligned with the tokens, verified.

The stand-in answers as vLLM started with ``--enable-return-routed-experts`` (`ExpertRouting`: its
own ``.npy`` writer, so the expected arrays are derived apart from `records`' codec, and read here
with NumPy). A token's experts depend on it, its position and the layer, so the routing of a whole
conversation read at once is what the stored rows of its turns must add up to."""

from __future__ import annotations

import base64
import hashlib
import io
import os

import numpy
import orjson
import pytest

from proxy.standin import start_stand_in
from proxy.standin.replies import ExpertRouting
from records import (
    Captures, RoutedExpertsProblem, read_routed_experts, read_token_entries, read_token_records, trajectories,
)
from records.contract.reading import experts_path
from tests.scripted_upstream import json_script
from tests.wire import fetch, rollout_url

MOE = ExpertRouting(layers=4, top_k=2, experts=8)
SYSTEM = {"role": "system", "content": "You are terse."}


@pytest.fixture
async def moe():
    server = await start_stand_in(routing=MOE)
    yield server
    await server.close()


def expected(routing: ExpertRouting, sequence: list[int], start: int = 0) -> numpy.ndarray:
    """What the stand-in returns for ``sequence`` read from ``start``, decoded by NumPy."""
    return numpy.load(io.BytesIO(base64.b64decode(routing.encoded(sequence, start))))


async def beside(http, direct_url: str, sidecar_url: str, rollout: str, path: str, body: dict) -> dict:
    """The call through the sidecar and directly: the agent's bytes are the upstream's."""
    raw = orjson.dumps(body)
    direct = await fetch(http, "POST", direct_url + path, raw)
    proxied = await fetch(http, "POST", rollout_url(sidecar_url, rollout, path), raw)
    assert (proxied.status, proxied.body) == (direct.status, direct.body)
    return orjson.loads(proxied.body)


async def two_turns(http, moe, sidecar, rollout: str, **extra) -> None:
    messages = [SYSTEM, {"role": "user", "content": "Say hello."}]
    first = await beside(http, moe.url, sidecar.url, rollout, "/v1/chat/completions",
                         {"model": "m", "messages": messages, **extra})
    messages += [{"role": "assistant", "content": first["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "Again."}]
    await beside(http, moe.url, sidecar.url, rollout, "/v1/chat/completions", {"model": "m", "messages": messages, **extra})


async def test_a_two_turn_rollouts_routed_experts_are_stored_once_and_read_back_aligned(http, moe, start, capture_dir,
                                                                                     store):
    sidecar = await start(moe.url, capture_dir=capture_dir, capture_tokens=True, capture_routed_experts=True)
    await two_turns(http, moe, sidecar, "moe")
    first, second = read_token_entries(capture_dir, "moe")
    assert second["parent_call_id"] == first["model_call_id"] and second["prompt_is_delta"]
    s1, s2 = first["cum_len"], second["cum_len"]
    # Each call's new rows once: the first's up to its last token, the second's from there.
    assert [(e["routed_experts"]["start"], e["routed_experts"]["shape"]) for e in (first, second)] == \
        [(0, [s1 - 1, 4, 2]), (s1 - 1, [s2 - s1, 4, 2])]
    for entry in (first, second):
        reference = entry["routed_experts"]
        with open(experts_path(capture_dir, "moe", reference["sha256"]), "rb") as handle:
            assert hashlib.sha256(handle.read()).hexdigest() == reference["sha256"]
    lines = store.read("moe")
    assert [line["response"]["choices"][0]["routed_experts"] for line in lines] == \
        [first["routed_experts"], second["routed_experts"]], "the line names the object, not the array"
    build = trajectories(capture_dir, "moe")
    assert not build.masked and [c.routed_experts for c in build.main.calls] == [first["routed_experts"],
                                                                                 second["routed_experts"]]
    whole = expected(MOE, build.main.token_ids)  # The conversation read at once.
    aligned = read_routed_experts(capture_dir, "moe", build.main)
    assert aligned is not None and aligned.shape == (len(build.main.token_ids) - 1, 4, 2)
    assert numpy.array_equal(aligned.to_numpy(), whole) and aligned.dtype == "|u1"
    records = read_token_records(store, "moe")
    assert [r.routed_experts for r in records] == [first["routed_experts"], second["routed_experts"]]
    turn2 = Captures(capture_dir).routed_experts("moe", records[1])
    assert turn2 is not None and numpy.array_equal(turn2.to_numpy(), whole[s1 - 1:])
    from records.training import trajectory_rows
    (row,) = trajectory_rows(capture_dir, "moe")
    assert numpy.array_equal(numpy.load(io.BytesIO(row["routed_experts"])), whole)
    # The live hand-off's item reads them too.
    from records import Consumer, end_rollout
    import asyncio

    # Ended and taken on a thread: the sidecar runs on this loop, and the end waits for its next
    # word on the calls in flight (one that named the rollout would otherwise stand until the bound).
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, end_rollout, capture_dir, "moe", {"reward": 1.0})
    trainer = Consumer(capture_dir, "trainer")
    (item,) = await loop.run_in_executor(None, lambda: trainer.take(1, wait=5.0))
    handed = item.routed_experts()
    assert handed is not None and numpy.array_equal(handed.to_numpy(), whole)


@pytest.mark.parametrize("stream", [False, True])
async def test_token_in_calls_routed_experts_are_stored_streamed_or_not(http, moe, start, capture_dir, stream):
    """vLLM's generate path returns them on the JSON reply's choice and on a stream's last chunk."""
    sidecar = await start(moe.url, capture_dir=capture_dir, capture_tokens=True, capture_routed_experts=True)
    sequence = [101, 7, 4242, 9, 15]
    for new in ([], [5, 6]):
        sequence += new
        body = {"token_ids": sequence, "sampling_params": {"max_tokens": 4, "logprobs": 0}, "stream": stream}
        raw = orjson.dumps(body)
        direct = await fetch(http, "POST", moe.url + "/inference/v1/generate", raw)
        proxied = await fetch(http, "POST", rollout_url(sidecar.url, "tito", "/inference/v1/generate"), raw)
        assert (proxied.status, proxied.body) == (direct.status, direct.body)
        sequence = list(read_token_records(capture_dir, "tito")[-1].prompt_token_ids or []) + \
            list(read_token_records(capture_dir, "tito")[-1].generation_token_ids or [])
    build = trajectories(capture_dir, "tito")
    assert not build.masked and build.main.token_ids == sequence
    aligned = read_routed_experts(capture_dir, "tito", build.main)
    assert aligned is not None and numpy.array_equal(aligned.to_numpy(), expected(MOE, sequence))
    assert sum(e["routed_experts"]["shape"][0] for e in read_token_entries(capture_dir, "tito")) == len(sequence) - 1


async def test_a_64_layer_top_8_model_with_more_than_256_experts_is_kept_in_uint16(http, start, capture_dir):
    routing = ExpertRouting(layers=64, top_k=8, experts=384)
    server = await start_stand_in(routing=routing)
    try:
        sidecar = await start(server.url, capture_dir=capture_dir, capture_tokens=True, capture_routed_experts=True)
        reply = await beside(http, server.url, sidecar.url, "big", "/v1/completions",
                             {"model": "m", "prompt": [11, 12, 13, 14], "max_tokens": 5})
        assert reply["choices"][0]["routed_experts"] is not None, "the agent gets what vLLM sends"
        (record,) = read_token_records(capture_dir, "big")
        rows = read_routed_experts(capture_dir, "big", record)
        sequence = [*record.prompt_token_ids, *record.generation_token_ids]
        assert rows is not None and rows.dtype == "<u2" and numpy.array_equal(rows.to_numpy(), expected(routing, sequence))
    finally:
        await server.close()


async def test_an_agents_own_prompt_start_is_its_own_and_the_rows_say_where_they_begin(http, moe, start, capture_dir):
    sidecar = await start(moe.url, capture_dir=capture_dir, capture_tokens=True, capture_routed_experts=True)
    reply = await beside(http, moe.url, sidecar.url, "own", "/v1/completions",
                         {"model": "m", "prompt": [11, 12, 13, 14], "max_tokens": 3, "routed_experts_prompt_start": 2})
    (entry,) = read_token_entries(capture_dir, "own")
    sequence = [11, 12, 13, 14, *entry["generation_token_ids"]]
    assert entry["routed_experts"]["start"] == 2
    rows = read_routed_experts(capture_dir, "own", entry["routed_experts"])
    assert rows is not None and numpy.array_equal(rows.to_numpy(), expected(MOE, sequence, 2))
    assert reply["choices"][0]["routed_experts"] == MOE.encoded(sequence, 2)
    # A chain whose first rows were never returned: the missing rows hold Gym's sentinel.
    build = trajectories(capture_dir, "own")
    aligned = read_routed_experts(capture_dir, "own", build.main)
    assert aligned is not None and aligned.dtype == "<i4"
    assert (aligned.to_numpy()[:2] == -1).all() and numpy.array_equal(aligned.to_numpy()[2:], expected(MOE, sequence, 2))


async def test_without_the_option_the_line_keeps_what_came_and_no_object_is_written(http, moe, start, capture_dir, store):
    sidecar = await start(moe.url, capture_dir=capture_dir, capture_tokens=True)
    await two_turns(http, moe, sidecar, "plain")
    assert [e["routed_experts"] for e in read_token_entries(capture_dir, "plain")] == [None, None]
    assert all(isinstance(line["response"]["choices"][0]["routed_experts"], str) for line in store.read("plain"))
    assert not os.path.exists(os.path.join(capture_dir, "plain.experts"))


async def test_an_object_that_is_not_what_its_reference_says_is_refused(http, moe, start, capture_dir):
    sidecar = await start(moe.url, capture_dir=capture_dir, capture_tokens=True, capture_routed_experts=True)
    await two_turns(http, moe, sidecar, "bad")
    first = read_token_entries(capture_dir, "bad")[0]["routed_experts"]
    path = experts_path(capture_dir, "bad", first["sha256"])
    with open(path, "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        handle.write(b"\x07")
    with pytest.raises(RoutedExpertsProblem, match="digest"):
        read_routed_experts(capture_dir, "bad", trajectories(capture_dir, "bad").main)
    os.unlink(path)
    with pytest.raises(RoutedExpertsProblem, match="not in"):
        read_routed_experts(capture_dir, "bad", first)


async def test_rows_that_do_not_fit_the_tokens_are_not_stored_and_the_entry_is_kept(http, upstream, start, capture_dir):
    """An engine whose rows disagree with its token ids (here one row short): the entry is written
    without them, the failure counted; the agent's reply is untouched."""
    sequence_reply = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "prompt_token_ids": [1, 2, 3],
                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop",
                                   "token_ids": [4, 5], "logprobs": {"content": [
                                       {"token": "h", "logprob": -0.1, "bytes": None, "top_logprobs": []},
                                       {"token": "i", "logprob": -0.2, "bytes": None, "top_logprobs": []}]},
                                   "routed_experts": MOE.encoded([1, 2, 3, 4], 0)}]}
    upstream.scripts["/v1/chat/completions"] = json_script(orjson.dumps(sequence_reply))
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True, capture_routed_experts=True)
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True,
                         "return_token_ids": True})
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "short", "/v1/chat/completions"), body)
    assert reply.body == orjson.dumps(sequence_reply)
    (entry,) = read_token_entries(capture_dir, "short")
    assert entry["generation_token_ids"] == [4, 5] and entry["routed_experts"] is None
    metrics = await fetch(http, "GET", sidecar.url + "/-/metrics")
    assert b'mcc_token_entry_failures_total{kind="routed_experts"} 1.0' in metrics.body


async def test_in_a_capture_store_the_objects_are_uploaded_and_read_back_from_the_store(http, moe, start, tmp_path,
                                                                                     monkeypatch):
    """Section "Routed experts" of docs/tokens.md: from the spool the objects go to the store as
    ``experts/<sha256>.npy`` before the token bundle that names them; a reader of the store's URL
    (`records.Captures`, a consumer's item) fetches and verifies them."""
    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    url = f"segments://{tmp_path}/store"
    sidecar = await start(moe.url, capture_dir=str(tmp_path / "spool"), capture_store=url, capture_tokens=True,
                          capture_routed_experts=True, segment_max_age=0.1)
    await two_turns(http, moe, sidecar, "stored")
    await sidecar.close()  # The drain seals, uploads and ships the token files and the objects.
    entries = read_token_entries(str(tmp_path / "spool"), "stored")
    names = sorted(os.listdir(tmp_path / "store" / "experts"))
    assert names == sorted(f"{e['routed_experts']['sha256']}.npy" for e in entries)
    captures = Captures(url)
    build = captures.trajectories("stored")
    aligned = captures.routed_experts("stored", build.main)
    assert aligned is not None and numpy.array_equal(aligned.to_numpy(), expected(MOE, build.main.token_ids))


def test_clearing_a_rollout_removes_its_objects(tmp_path):
    from records.contract import RoutedExperts, TokenFiles
    from records.contract.writing import write_routed_experts
    rows = RoutedExperts("|u1", (2, 1, 1), b"\x01\x02")
    reference = write_routed_experts(str(tmp_path), "gone", rows)
    assert os.path.exists(experts_path(str(tmp_path), "gone", reference["sha256"]))
    TokenFiles(str(tmp_path)).delete("gone")
    assert not os.path.exists(os.path.join(tmp_path, "gone.experts"))


async def test_an_upstream_whose_replies_carry_no_routed_experts_is_said_once(http, upstream, start, capture_dir, caplog):
    """--capture-routed-experts in front of a server started without --enable-return-routed-experts
    (or a dense model): the calls are captured as ever, and the log says why nothing is stored, once."""
    import logging

    from tests.proxy.training.test_token_files import converse, serve_model
    from tests.vllm_chat_model import TinyChatModel

    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True, capture_routed_experts=True)
    with caplog.at_level(logging.WARNING):
        await converse(http, sidecar, "dense", ["hi", "more", "thanks"])
    said = [r.getMessage() for r in caplog.records if "carries no routed_experts" in r.getMessage()]
    assert len(said) == 1 and "--enable-return-routed-experts" in said[0]
    assert len(read_token_entries(capture_dir, "dense")) == 3, "the calls' entries are written as ever"
