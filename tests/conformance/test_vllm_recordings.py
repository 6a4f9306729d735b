"""Real vLLM 0.32.0 bytes through the sidecar: the token capture mode's byte identity, and the four
defects the trial against a real vLLM found (issue 20), each on the recorded bytes."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from capture import AddedFieldCutter, CuttingStreamTap, StreamTap, add_request_fields, token_fields_to_add
from records import build_model_call_record, read_token_records
from tests.capture_outcomes import outcome_with_cut_entries
from tests.scripted_upstream import Script
from tests.wire import fetch, rollout_url

from .vllm_recordings import CASES_BY_NAME, Replay, case_params, normalised, pieces, requires_vllm_recordings

pytestmark = [pytest.mark.conformance, requires_vllm_recordings]
#: Fields the mode adds for vLLM 0.33 that the 0.32 recordings predate (0.32 ignores them: the
#: reply is the same bytes; issue 32).
NEWER_THAN_THE_RECORDINGS = frozenset({"return_weight_versions"})


def sent_by_the_mode(case) -> bytes:
    """The request the mode sends for the case: the recorded added one, with the fields newer than
    the recordings (vLLM 0.32 replies to it with the same bytes)."""
    fields = token_fields_to_add(case.dialect, orjson.loads(case.asked.request))
    return add_request_fields(case.asked.request, fields)


@pytest.mark.parametrize("case", case_params(with_added=True))
def test_the_fields_added_are_vllms_and_cutting_them_gives_the_asked_bytes(case):
    """The request the mode sends is byte for byte the recorded "added" one, and cutting the
    recorded added reply -- whole, byte by byte, at random points -- gives the asked reply."""
    agent_request = orjson.loads(case.asked.request)
    fields = token_fields_to_add(case.dialect, agent_request)
    recorded = {name: value for name, value in fields.items() if name not in NEWER_THAN_THE_RECORDINGS}
    assert recorded == case.added_fields
    assert add_request_fields(case.asked.request, recorded) == case.added.request
    for split in ("whole", "1-byte", "random", "events"):
        cutter = AddedFieldCutter(case.dialect, fields, agent_request)
        if case.stream:
            parts = [case.added.body[i:i + 1] for i in range(len(case.added.body))] if split == "1-byte" \
                else pieces(case.added.body, split)
            cut = b"".join(cutter.feed(part) for part in parts) + cutter.close()
            # As the proxy runs it: inside the tap, one parse for the capture and the cut.
            alone, joint_cutter = StreamTap(case.dialect), AddedFieldCutter(case.dialect, fields, agent_request)
            joint = CuttingStreamTap(case.dialect, cutter=joint_cutter)
            out = []
            for part in parts:
                alone.feed(part)
                joint.feed(part)
                out.append(joint.take_output())
            assert normalised(b"".join(out) + joint.close_output()) == normalised(case.asked.body), split
            assert outcome_with_cut_entries(joint) == alone.finish(200), \
                "the capture is the same with the cutter inside"
        else:
            cut = cutter.cut_body(case.added.body)
        assert normalised(cut) == normalised(case.asked.body), split


@pytest.mark.parametrize("split", ["events", "7-byte", "random"])
@pytest.mark.parametrize("case", case_params(with_added=True))
async def test_the_agent_gets_what_vllm_sends_for_its_own_request(http, upstream, start, capture_dir, store, case, split):
    """Through the sidecar in token capture mode, the agent's reply equals the direct reply to its
    own request (ids and timestamps aside, which vLLM makes fresh per call), head included; the
    upstream received the added request; the line has the arrays and says what was added."""
    upstream.responder = Replay(split)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    direct = await fetch(http, "POST", upstream.url + case.path, case.asked.request)
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "tok", case.path), case.asked.request)
    assert upstream.received[-1].body == sent_by_the_mode(case)
    assert (proxied.status, proxied.reason) == (direct.status, direct.reason)
    assert normalised(proxied.body) == normalised(direct.body)
    expected_headers = [(name, str(len(proxied.body)) if name.lower() == "content-length" else value)
                        for name, value in direct.headers]
    assert proxied.headers == expected_headers
    (line,) = store.read("tok")
    assert line["added_request_fields"] == token_fields_to_add(case.dialect, orjson.loads(case.asked.request))
    assert line["request"] == orjson.loads(case.asked.request), "the line keeps the agent's own request"
    if case.stream:
        # What the upstream sent, until the reply was whole: where the request asked for usage, the
        # line is made at the usage chunk and a `[DONE]` read after it is not on it (issue 55).
        sent, raw = case.added.body.decode(), line["response_raw"]
        assert sent.startswith(raw) and '"usage"' not in sent[len(raw):] and "finish_reason" not in sent[len(raw):], \
            "the line keeps what the upstream sent"
    (first, *_) = read_token_records(store, "tok")
    assert first.prompt_token_ids and first.generation_token_ids, first


async def test_a_field_the_upstream_refuses_is_learnt_once_and_the_agent_never_sees_it(http, upstream, start, capture_dir, store):
    """A server that answers 400 to an added field: the agent's own request is resent, the agent
    gets its reply, the field is not added again (one 400 in all, whatever the number of calls)."""
    case = CASES_BY_NAME["chat"]
    refusal = b'{"error":{"message":"Unrecognized request argument supplied: return_token_ids","type":"invalid_request_error"}}'

    def refuse_added(request):
        if b'"return_token_ids"' in request.body:
            return Script(status=400, reason="Bad Request", pieces=[refusal],
                          headers=[("Content-Type", "application/json"), ("Content-Length", str(len(refusal)))])
        return case.asked.script("whole") if request.body == case.asked.request else \
            Script(status=200, reason="OK", pieces=[case.asked.body],
                   headers=[("Content-Type", "application/json"), ("Content-Length", str(len(case.asked.body)))])

    upstream.responder = refuse_added
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    replies = [await fetch(http, "POST", rollout_url(sidecar.url, "refused", case.path), case.asked.request)
               for _ in range(3)]
    assert all(reply.status == 200 and reply.body == case.asked.body for reply in replies)
    bodies = [request.body for request in upstream.received]
    assert sum(b'"return_token_ids"' in body for body in bodies) == 1, "refused once, then never added again"
    assert orjson.loads(bodies[1]) == orjson.loads(case.asked.request), "the agent's own request, resent"
    lines = store.read("refused")
    assert [line["status_code"] for line in lines] == [200, 200, 200]
    assert "added_request_fields" not in lines[0], "the reply is to the agent's own request"
    assert lines[1]["added_request_fields"] == {"logprobs": True, "return_weight_versions": True}, \
        "only the refused field is dropped"


async def test_a_bad_request_of_the_agent_itself_is_answered_as_it_would_be(http, upstream, start, capture_dir, store):
    """A 400 that the agent's own request gets too: forwarded as the upstream sent it, nothing learnt."""
    refusal = b'{"error":{"message":"messages is required","type":"BadRequestError","code":400}}'
    upstream.scripts["/v1/chat/completions"] = Script(status=400, reason="Bad Request", pieces=[refusal], headers=[
        ("Content-Type", "application/json"), ("Content-Length", str(len(refusal)))])
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    for _ in range(2):
        reply = await fetch(http, "POST", rollout_url(sidecar.url, "bad", "/v1/chat/completions"), b'{"model":"m"}')
        assert reply.status == 400 and reply.body == refusal
    assert [orjson.loads(r.body) for r in upstream.received] == [
        {"model": "m", "logprobs": True, "return_token_ids": True, "return_weight_versions": True},
        {"model": "m"}] * 2, "the fields are still added"
    assert [line["error_category"] for line in store.read("bad")] == ["client_error", "client_error"]


# -- the four defects of the trial, on the recorded bytes --------------------------------------

async def test_a_responses_stream_vllm_ends_incomplete_is_recorded_incomplete(http, upstream, sidecar, store):
    """vLLM 0.32 ends a capped Responses stream with `response.completed` whose status is incomplete."""
    case = CASES_BY_NAME["responses-stream-incomplete"]
    upstream.responder = Replay()
    await fetch(http, "POST", rollout_url(sidecar.url, "capped", case.path), case.asked.request)
    (line,) = store.read("capped")
    assert line["error_category"] == "incomplete" and line["response"]["status"] == "incomplete"
    record = build_model_call_record(line, 0)
    assert record.finish_reason == "max_output_tokens"


async def test_an_error_event_in_a_200_stream_is_durable_before_the_agent_sees_it(http, upstream, sidecar, store):
    """vLLM answers `top_logprobs: 50` with 200, a `data: {"error": ...}` event, then `[DONE]`. The
    SDK stops at the error event, so that event is the terminal the sidecar holds back."""
    case = CASES_BY_NAME["chat-stream-error-event"]
    error_event, done = case.asked.body.split(b"\n\n", 1)[0] + b"\n\n", case.asked.body.split(b"\n\n", 1)[1]
    upstream.scripts[case.path] = Script(headers=[("Content-Type", "text/event-stream; charset=utf-8")], chunked=True,
                                         pieces=[error_event], ending="hang", hang_for=5)
    async with http.post(rollout_url(sidecar.url, "err", case.path), data=case.asked.request) as response:
        seen = b""
        while b"\n\n" not in seen:
            seen += await asyncio.wait_for(response.content.readany(), 10)
        (line,) = store.read("err")  # On disk by the time the agent has the error event.
    assert seen == error_event and done.strip() == b"data: [DONE]"
    assert line["error_category"] == "upstream_error" and line["response"]["error"]["param"] == "logprobs"


async def test_tool_arguments_with_integers_beyond_64_bits_stay_exact(http, upstream, sidecar, store):
    case = CASES_BY_NAME["chat-tools-bigint"]
    upstream.responder = Replay()
    await fetch(http, "POST", rollout_url(sidecar.url, "big", case.path), case.asked.request)
    (line,) = store.read("big")
    arguments = line["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    (call,) = build_model_call_record(line, 0).tool_calls
    import json
    assert call["arguments"] == json.loads(arguments) and isinstance(call["arguments"]["b"], int)
    assert call["arguments"]["b"] > 2 ** 64


async def test_a_generation_the_agent_did_not_see_whole_is_never_usable(upstream, start, capture_dir, store):
    """A stream the agent left mid-way (cancelled): its arrays are there, but not usable, with the reason."""
    case = CASES_BY_NAME["chat-stream"]
    events = pieces(case.added.body, "events")
    upstream.scripts[case.path] = Script(headers=[("Content-Type", "text/event-stream; charset=utf-8")], chunked=True,
                                         pieces=events[:5], ending="hang", hang_for=5)
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    async with aiohttp.ClientSession() as session:
        async with session.post(rollout_url(sidecar.url, "left", case.path), data=case.added.request) as response:
            await asyncio.wait_for(response.content.readany(), 10)
    for _ in range(200):
        if store.read("left"):
            break
        await asyncio.sleep(0.02)
    (record,) = read_token_records(store, "left")
    assert record.error_category == "cancelled" and record.generation_token_ids
    assert not record.usable and "cancelled" in (record.unusable_reason or "")


async def test_a_stream_with_a_content_length_is_cut_whole_and_its_length_recomputed(http, upstream, start, capture_dir):
    """vLLM streams chunked; a server that sizes its stream gets it cut whole, with the new length."""
    case = CASES_BY_NAME["chat-stream"]
    sized = [("content-type", "text/event-stream; charset=utf-8"), ("content-length", str(len(case.added.body)))]
    upstream.responder = lambda request: Script(headers=sized, pieces=pieces(case.added.body, "random")) \
        if request.body == sent_by_the_mode(case) else None
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "sized", case.path), case.asked.request)
    assert normalised(proxied.body) == normalised(case.asked.body)
    assert proxied.header("content-length") == str(len(proxied.body))


async def test_the_ray_datasets_rows_of_real_vllm_calls_are_the_readers(http, upstream, start, capture_dir, store):
    """Every recorded vLLM reply that the token capture mode adds fields to, captured into one
    rollout: a Ray dataset read task (which cuts a chat reply's prompt ids out by their bytes and
    places them against the earlier calls) gives `read_token_records`' rows for vLLM's own bytes."""
    pytest.importorskip("pyarrow", reason="the Ray dataset is the optional extra model-call-capture[ray]")
    from records.training._datasets import read_group, token_row

    from .vllm_recordings import CASES

    upstream.responder = Replay("events")
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    cases = [case for case in CASES if case.added is not None]
    for case in cases:
        await fetch(http, "POST", rollout_url(sidecar.url, "tok", case.path), case.asked.request)
    rows = [row for table in read_group([str(store.path_for("tok"))], "tokens") for row in table.to_pylist()]
    expected = [token_row(record) for record in read_token_records(store, "tok")]
    assert len(rows) == len(expected) >= len(cases)
    assert [{name: row[name] for name in want} for row, want in zip(rows, expected)] == expected
    assert {row["source"] for row in rows} >= {"vllm"} and any(row["prompt_token_ids"] for row in rows)


@pytest.mark.parametrize("split", ["whole", "events", "1-byte", "7-byte", "random"])
async def test_a_responses_stream_that_lost_a_tokens_logprob_is_unusable_and_said(
        http, upstream, start, capture_dir, store, split, caplog):
    """The recorded `responses-stream`: 17 generated ids, 16 logprobs. vLLM's Responses stream
    sends no event, so no logprob, for a token whose text is empty (id 134, the first byte of a
    UTF-8 character: the whole reply's logprobs, `responses`, have it as ``""``). No entry can be
    right, so none is written; the record says why, the log says it once, a metric counts it, and
    the agent's reply is its own, at every split."""
    from records import read_token_entries

    case = CASES_BY_NAME["responses-stream"]
    upstream.responder = Replay(split)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    with caplog.at_level("WARNING", logger="mcc"):
        for attempt in ("rs-1", "rs-2"):
            reply = await fetch(http, "POST", rollout_url(sidecar.url, attempt, case.path), case.asked.request)
            assert reply.status == 200 and normalised(reply.body) == normalised(case.asked.body)
    for rollout in ("rs-1", "rs-2"):
        (record,) = read_token_records(store, rollout)
        assert len(record.generation_token_ids) == 17 and len(record.generation_log_probs) == 16
        assert not record.usable and "text is empty" in record.unusable_reason, record.unusable_reason
        assert read_token_entries(capture_dir, rollout) == []
    said = [r.getMessage() for r in caplog.records if "cannot be trained on" in r.getMessage()]
    assert len(said) == 1 and "part of a UTF-8 character" in said[0], said
    metrics = (await fetch(http, "GET", sidecar.url + "/-/metrics")).body.decode()
    assert 'mcc_token_entry_failures_total{kind="arrays_unusable"} 2.0' in metrics


def test_the_whole_responses_reply_has_the_logprob_the_stream_lost():
    """Where the extra id comes from, on the recordings themselves: the same generation asked
    whole (`responses`) has 17 logprobs, the 15th for a token whose text is empty; the stream's 16
    are the whole reply's without that one."""
    whole = orjson.loads(CASES_BY_NAME["responses"].added.body)
    events = [orjson.loads(line[6:]) for line in CASES_BY_NAME["responses-stream"].added.body.split(b"\n")
              if line.startswith(b"data: ") and line[6:] != b"[DONE]"]
    streamed = events[-1]["response"]
    assert whole["output_messages"][0]["tokens"] == streamed["output_messages"][0]["tokens"]
    every = [(entry["token"], entry["logprob"]) for entry in whole["output"][0]["content"][0]["logprobs"]]
    sent = [(entry["token"], entry["logprob"]) for entry in streamed["output"][0]["content"][0]["logprobs"]]
    gap = [index for index, (token, _) in enumerate(every) if token == ""]
    assert len(every) == 17 and gap == [14] and sent == every[:14] + every[15:]
