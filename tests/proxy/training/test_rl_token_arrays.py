"""RL traffic (issue 13): logprobs and vLLM token ids kept whole, read back as training arrays.

Every transcript runs whole, one byte at a time, at seeded random splits and per event
(`run_everywhere`), and where the openai SDK's `ChatCompletionStreamState` finishes, our
logprobs equal its accumulation entry for entry (`tests/sdk_oracle.chat_view`).
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI

from records import CaptureStore, TokenRecord, iter_token_records, read_token_records

from tests import transcripts as t
from tests.scripted_upstream import json_script, sse_script
from tests.capture.test_reassembly import reassemble, run_everywhere
from tests.wire import assert_same_reply, fetch, rollout_url

CHAT = "/v1/chat/completions"


def _expected(choice: int, tokens: int) -> tuple[list[int], list[float]]:
    steps = [t.rl_token(choice, step) for step in range(tokens)]
    return [token_id for token_id, _, _ in steps], [logprob for _, _, logprob in steps]


def _records_of(response: dict, category: str | None = None) -> list[TokenRecord]:
    from records.contract import token_records_of_line
    return token_records_of_line({"model_call_id": "c1", "error_category": category, "response": response}, "r", 0)


@pytest.mark.parametrize("as_token_ids", [False, True])
def test_vllm_stream_keeps_logprobs_token_ids_and_prompt_ids(as_token_ids):
    outcome = run_everywhere("chat", t.vllm_rl_chat_stream(tokens=6, top_logprobs=3, as_token_ids=as_token_ids))
    choice = outcome.response["choices"][0]
    ids, logprobs = _expected(0, 6)
    assert choice["token_ids"] == ids and outcome.response["prompt_token_ids"] == t.RL_PROMPT_IDS
    assert [entry["logprob"] for entry in choice["logprobs"]["content"]] == logprobs
    assert all(len(entry["top_logprobs"]) == 3 for entry in choice["logprobs"]["content"])
    assert choice["stop_reason"] is None and choice["finish_reason"] == "stop"
    (record,) = _records_of(outcome.response)
    assert (record.prompt_token_ids, record.generation_token_ids, record.generation_log_probs) == (t.RL_PROMPT_IDS, ids, logprobs)
    assert record.source == "vllm" and record.usable and record.finish_reason == "stop"


def test_n2_keeps_each_choice_apart_and_the_prompt_once():
    """vLLM repeats prompt_token_ids on each choice's first chunk: the prompt is not doubled."""
    outcome = run_everywhere("chat", t.vllm_rl_chat_stream(tokens=5, n=2))
    assert outcome.response["prompt_token_ids"] == t.RL_PROMPT_IDS
    records = _records_of(outcome.response)
    assert [r.choice_index for r in records] == [0, 1]
    for record in records:
        assert (record.generation_token_ids, record.generation_log_probs) == _expected(record.choice_index, 5)
        assert record.prompt_token_ids == t.RL_PROMPT_IDS and record.usable


def test_token_id_tokens_alone_give_the_generation_ids():
    """return_tokens_as_token_ids without return_token_ids: the ids come from `token_id:N` tokens."""
    body = t.vllm_rl_chat_stream(tokens=4, as_token_ids=True)
    response = reassemble("chat", [body]).response
    for choice in response["choices"]:
        del choice["token_ids"]
    (record,) = _records_of(response)
    assert record.source == "logprob_tokens" and record.generation_token_ids == _expected(0, 4)[0]
    assert record.usable


def test_a_cut_stream_keeps_the_arrays_up_to_the_cut():
    outcome = run_everywhere("chat", t.vllm_rl_chat_stream(tokens=8, cut_after=5))
    assert outcome.error_category == "stream_truncated"
    (record,) = _records_of(outcome.response, outcome.error_category)
    ids, logprobs = _expected(0, 8)
    assert (record.generation_token_ids, record.generation_log_probs) == (ids[:5], logprobs[:5])
    assert record.finish_reason is None and record.error_category == "stream_truncated"


def test_error_chunk_with_usage_keeps_the_usage():
    """OpenRouter sends usage on the error chunk that follows finish_reason: length."""
    outcome = run_everywhere("chat", t.vllm_rl_chat_stream(tokens=4, error_with_usage=True))
    assert outcome.error_category == "upstream_error"
    assert outcome.response["usage"] == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert outcome.response["error"]["message"] == "Token limit reached"
    assert outcome.response["choices"][0]["finish_reason"] == "length"
    assert outcome.response["choices"][0]["token_ids"] == _expected(0, 4)[0]


def test_streamed_and_whole_replies_give_the_same_arrays():
    streamed = _records_of(reassemble("chat", [t.vllm_rl_chat_stream(tokens=7, top_logprobs=0)]).response)
    whole = _records_of(orjson.loads(t.vllm_rl_chat_json(tokens=7)))
    assert streamed == whole


def test_nemo_rl_message_fields_come_first():
    (record,) = _records_of(orjson.loads(t.NEMO_RL_CHAT_JSON))
    assert (record.source, record.prompt_token_ids, record.generation_token_ids, record.generation_log_probs) == (
        "message", [1, 2, 3], [7, 8], [-0.25, -0.5])


def test_disagreeing_lengths_are_reported_never_padded():
    response = orjson.loads(t.vllm_rl_chat_json(tokens=4))
    response["choices"][0]["token_ids"].append(99)
    (record,) = _records_of(response)
    assert record.generation_token_ids == _expected(0, 4)[0] + [99] and len(record.generation_log_probs) == 4
    assert not record.usable and "5 entries" in record.problem and "4" in record.problem


def test_token_ids_that_contradict_token_id_tokens_are_reported():
    response = reassemble("chat", [t.vllm_rl_chat_stream(tokens=3, as_token_ids=True)]).response
    response["choices"][0]["token_ids"][1] = 7
    (record,) = _records_of(response)
    assert not record.usable and "disagree" in record.problem


def test_missing_arrays_are_named():
    response = reassemble("chat", [t.CHAT_STREAM]).response
    (record,) = _records_of(response)
    assert record.source == "missing" and not record.usable
    assert record.missing == ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
    (no_reply,) = _records_of(None)
    assert no_reply.missing == record.missing and no_reply.choice_index == 0


def test_unknown_fields_follow_one_rule():
    """Per-chunk lists concatenate, other values: the last non-null one; delta text concatenates."""
    def chunk(choice: dict, **top: object) -> bytes:
        return t.chat_chunk([{"index": 0, **choice}], **top)
    body = b"".join([
        chunk({"delta": {"role": "assistant", "content": ""}, "extra_ids": [1]}, provider="A", routing={"a": 1}),
        chunk({"delta": {"content": "x", "annotation": "ab"}, "extra_ids": [2, 3], "native": "s1"}, provider=None),
        chunk({"delta": {"annotation": "c"}, "extra_ids": None, "native": "s2"}, provider="B"),
        chunk({"delta": {}, "finish_reason": "stop"}),
        b"data: [DONE]\n\n",
    ])
    response = run_everywhere("chat", body).response
    choice = response["choices"][0]
    assert choice["extra_ids"] == [1, 2, 3] and choice["native"] == "s2"
    assert choice["message"]["annotation"] == "abc"
    assert response["provider"] == "B" and response["routing"] == {"a": 1}


def test_responses_logprobs_on_deltas_fill_a_terminal_that_lacks_them():
    outcome = run_everywhere("responses", t.RESPONSES_LOGPROBS_ON_DELTAS_ONLY)
    part = outcome.response["output"][0]["content"][0]
    assert [entry["token"] for entry in part["logprobs"]] == ["Hel", "lo"]
    cut = t.RESPONSES_LOGPROBS_ON_DELTAS_ONLY.split(b"event: response.completed")[0]
    partial = run_everywhere("responses", cut).response["output"][0]["content"][0]
    assert (partial["text"], [entry["token"] for entry in partial["logprobs"]]) == ("Hello", ["Hel", "lo"])


def test_long_logprob_stream_is_whole():
    """32,000 tokens, one logprob entry and one id per chunk: every entry kept, in order."""
    body = t.vllm_rl_chat_stream(tokens=32_000, top_logprobs=0)
    pieces = [part + b"\n\n" for part in body.split(b"\n\n")[:-1]]
    response = reassemble("chat", pieces).response
    (record,) = _records_of(response)
    assert record.generation_token_ids == _expected(0, 32_000)[0] and record.usable


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([dict(tokens=5, n=2, top_logprobs=2), dict(tokens=4, as_token_ids=True),
                        dict(tokens=6, cut_after=4), dict(tokens=3, error_with_usage=True)]),
       st.lists(st.integers(min_value=1), max_size=40))
def test_any_split_gives_the_same_arrays(shape, cut_seeds):
    body = t.vllm_rl_chat_stream(**shape)
    cuts = sorted({seed % len(body) for seed in cut_seeds} - {0})
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]
    assert _records_of(reassemble("chat", pieces).response) == _records_of(reassemble("chat", [body]).response)


# -- Through the real sidecar -------------------------------------------------------------------

@pytest.mark.parametrize("raw_stream", ["always", "on-failure"])
async def test_raw_stream_setting(http, upstream, start, capture_dir, raw_stream):
    """on-failure drops response_raw from a stream rebuilt whole, keeps it for a cut one."""
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_raw_stream=raw_stream)
    whole, cut = t.vllm_rl_chat_stream(tokens=5), t.vllm_rl_chat_stream(tokens=5, cut_after=3)
    upstream.scripts[CHAT] = sse_script(whole)
    direct = await fetch(http, "POST", upstream.url + CHAT, t.CHAT_REQUEST)
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "raw", CHAT), t.CHAT_REQUEST)
    assert_same_reply(direct, proxied)
    upstream.scripts[CHAT] = sse_script(cut)
    await fetch(http, "POST", rollout_url(sidecar.url, "raw", CHAT), t.CHAT_REQUEST)
    first, second = CaptureStore(capture_dir).read("raw")
    assert ("response_raw" in first) == (raw_stream == "always")
    assert second["response_raw"] == cut.decode() and second["error_category"] == "stream_truncated"
    assert [r.generation_token_ids for r in read_token_records(CaptureStore(capture_dir), "raw")] == [
        _expected(0, 5)[0], _expected(0, 3)[0]]


async def test_whole_json_reply_keeps_the_arrays(http, upstream, sidecar, capture_dir):
    upstream.scripts[CHAT] = json_script(t.vllm_rl_chat_json(tokens=4, n=2))
    await fetch(http, "POST", rollout_url(sidecar.url, "json", CHAT), t.CHAT_JSON_REQUEST)
    records = list(iter_token_records(capture_dir, "json"))
    assert [(r.choice_index, r.generation_token_ids) for r in records] == [(0, _expected(0, 4)[0]), (1, _expected(1, 4)[0])]


async def test_openai_sdk_stream_with_logprobs_and_token_ids_reads_back(start, stand_in, capture_dir):
    """The real openai SDK asks the stand-in for vLLM's RL fields through the sidecar; the arrays
    read back equal what the SDK received, and the streamed generation equals the whole one."""
    sidecar = await start(stand_in.url, capture_dir=capture_dir)
    extra = {"return_token_ids": True}
    async with AsyncOpenAI(base_url=rollout_url(sidecar.url, "rl-sdk", "/v1"), api_key="k", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="stand-in-1", messages=[{"role": "user", "content": "Think, then answer."}], stream=True,
            logprobs=True, top_logprobs=2, extra_body=extra)
        chunks = [chunk async for chunk in stream]
        whole = await client.chat.completions.create(
            model="stand-in-1", messages=[{"role": "user", "content": "Think, then answer."}],
            logprobs=True, top_logprobs=2, extra_body=extra)
    received_ids = [token for chunk in chunks for choice in chunk.choices for token in (choice.model_extra.get("token_ids") or [])]
    received_logprobs = [entry.logprob for chunk in chunks for choice in chunk.choices
                         for entry in ((choice.logprobs.content if choice.logprobs else None) or [])]
    streamed_record, whole_record = read_token_records(CaptureStore(capture_dir), "rl-sdk")
    assert streamed_record.usable and streamed_record.source == "vllm"
    assert streamed_record.generation_token_ids == received_ids and streamed_record.generation_log_probs == received_logprobs
    assert streamed_record.prompt_token_ids == chunks[0].model_extra["prompt_token_ids"]
    assert len(streamed_record.generation_token_ids) == whole.usage.completion_tokens
    assert (streamed_record.generation_token_ids, streamed_record.generation_log_probs) == (
        whole_record.generation_token_ids, whole_record.generation_log_probs)
    # The stand-in's prompt is as long as the request body makes it (stream=true makes it longer).
    assert whole_record.usable and len(whole_record.prompt_token_ids) == whole.usage.prompt_tokens


def test_parquet_export_gains_the_arrays_on_request(tmp_path):
    """`mcc export --format parquet --token-arrays`: one row per call and choice, list columns."""
    pq = pytest.importorskip("pyarrow.parquet", reason="Parquet export needs the 'export' extra (pyarrow)")
    from click.testing import CliRunner

    from proxy import main
    from records.contract import encode_capture_line

    directory = tmp_path / "captures"
    directory.mkdir()
    n2 = reassemble("chat", [t.vllm_rl_chat_stream(tokens=3, n=2)]).response
    lines = [{"model_call_id": "a", "dialect": "chat", "status_code": 200, "error_category": None, "response": n2},
             {"model_call_id": "b", "dialect": "chat", "status_code": 200, "error_category": None,
              "response": orjson.loads(t.CHAT_JSON)}]
    (directory / "rl.capture.jsonl").write_bytes(b"".join(encode_capture_line(line) for line in lines))
    for flags, rows in (([], 2), (["--token-arrays"], 3)):
        output = str(tmp_path / f"out{len(flags)}.parquet")
        result = CliRunner().invoke(main, ["export", str(directory), "--format", "parquet", "-o", output, *flags])
        assert result.exit_code == 0, result.output
        table = pq.read_table(output).to_pylist()
        assert len(table) == rows
    assert [(row["call_index"], row["choice_index"], row["token_source"]) for row in table] == [
        (0, 0, "vllm"), (0, 1, "vllm"), (1, 0, "missing")]
    assert table[1]["generation_token_ids"] == _expected(1, 3)[0] and table[1]["generation_log_probs"] == _expected(1, 3)[1]
    assert table[0]["prompt_token_ids"] == t.RL_PROMPT_IDS and table[2]["generation_token_ids"] is None
