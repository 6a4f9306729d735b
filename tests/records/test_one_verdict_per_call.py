"""One verdict per call (issue 61): every reader -- `records.read_token_records`, `mcc show`,
`mcc stats`, the report -- says of a token capture mode call what the trajectory builder decided
(`records.TrajectoryBuild.links`), and a two-turn Responses rollout on the stand-in links as the
same rollout on vLLM would (vLLM's Responses server builds a reasoning item sent back into the
turn it preceded, and leaves a previous response's reasoning out)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai import AsyncOpenAI

from records import read_token_records, trajectories

from tests.wire import fetch, rollout_url


def verdicts_of_records(directory: str, rollout_id: str) -> dict[str, tuple[Any, ...]]:
    """What `read_token_records` says of each call: (link, reason, the call it extends, drift_at)."""
    records = read_token_records(directory, rollout_id)
    call_ids = {record.call_index: record.model_call_id for record in records}
    return {record.model_call_id: (record.link, record.link_reason, call_ids.get(record.extends), record.drift_at)
            for record in records if record.model_call_id}


def verdicts_of_builder(directory: str, rollout_id: str) -> dict[str, tuple[Any, ...]]:
    """The builder's verdicts (`TrajectoryBuild.links`) in the same shape."""
    return {call_id: (link.status, link.reason, link.parent_call_id if link.status == "extends" else None,
                      link.drift_at) for call_id, link in trajectories(directory, rollout_id).links.items()}


def response_of(body: bytes, stream: bool) -> dict[str, Any]:
    """A Responses reply, from its JSON or its stream's ``response.completed``."""
    if not stream:
        return orjson.loads(body)  # type: ignore[no-any-return]
    for line in body.split(b"\n"):
        if line.startswith(b"data: ") and b'"response.completed"' in line:
            return orjson.loads(line[6:])["response"]  # type: ignore[no-any-return]
    raise AssertionError("no response.completed event")


async def two_responses_turns(http: Any, url: str, rollout_id: str, *, keep_reasoning: bool, stream: bool,
                              sdk: bool, previous: bool = False) -> None:
    """Turn 1, then turn 2 sending turn 1's output back (its reasoning item kept or not), or
    continuing it by ``previous_response_id`` (``previous``)."""
    first_input = [{"role": "user", "content": "What is the weather in Paris?"}]
    base = rollout_url(url, rollout_id, "/v1")
    if sdk:
        async with AsyncOpenAI(base_url=base, api_key="k", max_retries=0) as client:
            if stream:
                async with client.responses.stream(model="m", input=first_input) as events:
                    first = await events.get_final_response()
            else:
                first = await client.responses.create(model="m", input=first_input)
            output = [item.model_dump(exclude_none=True) for item in first.output]
            response_id = first.id
            second = (dict(input=[{"role": "user", "content": "And tomorrow?"}], previous_response_id=response_id)
                      if previous else
                      dict(input=[*first_input, *(item for item in output if keep_reasoning or item["type"] != "reasoning"),
                                  {"role": "user", "content": "And tomorrow?"}]))
            if stream:
                async with client.responses.stream(model="m", **second) as events:  # type: ignore[arg-type]
                    await events.get_final_response()
            else:
                await client.responses.create(model="m", **second)  # type: ignore[arg-type]
        return
    reply = await fetch(http, "POST", base + "/responses", orjson.dumps({"model": "m", "input": first_input, "stream": stream}))
    assert reply.status == 200
    response = response_of(reply.body, stream)
    output = response["output"]
    second_body: dict[str, Any] = {"model": "m", "stream": stream}
    if previous:
        second_body.update(input="And tomorrow?", previous_response_id=response["id"])
    else:
        second_body["input"] = [*first_input, *(item for item in output if keep_reasoning or item["type"] != "reasoning"),
                                {"role": "user", "content": "And tomorrow?"}]
    reply = await fetch(http, "POST", base + "/responses", orjson.dumps(second_body))
    assert reply.status == 200, reply.body


@pytest.mark.parametrize("sdk", [True, False], ids=["sdk", "http"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_two_turn_responses_rollout_on_the_stand_in_links_as_on_vllm(http, stand_in, start, capture_dir,
                                                                                sdk, stream):
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True, supply_prefix=False)  # The drift shows without supply.
    await two_responses_turns(http, sidecar.url, "kept", keep_reasoning=True, stream=stream, sdk=sdk)
    await two_responses_turns(http, sidecar.url, "dropped", keep_reasoning=False, stream=stream, sdk=sdk)

    kept = trajectories(capture_dir, "kept")
    assert not kept.masked, kept.mask_reason
    first, second = read_token_records(capture_dir, "kept")
    assert (second.link, second.extends, second.drift_at) == ("extends", first.call_index, None)

    dropped = trajectories(capture_dir, "dropped")
    assert dropped.masked
    first, second = read_token_records(capture_dir, "dropped")
    # Without its reasoning the sent-back turn renders without it: the prompt departs where it was.
    assert second.link == "unlinked" and second.link_reason == "parent_digest_mismatch"
    assert second.drift_at == len(first.prompt_token_ids) > 0 and second.drift_from == first.call_index
    for rollout_id in ("kept", "dropped"):
        assert verdicts_of_records(capture_dir, rollout_id) == verdicts_of_builder(capture_dir, rollout_id)


@pytest.mark.parametrize("sdk, stream", [(False, False), (True, True)], ids=["http-json", "sdk-stream"])
async def test_a_previous_response_id_continues_a_stored_response_without_its_reasoning(http, stand_in, start,
                                                                                        capture_dir, sdk, stream):
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    await two_responses_turns(http, sidecar.url, "by-id", keep_reasoning=True, stream=stream, sdk=sdk, previous=True)
    first, second = read_token_records(capture_dir, "by-id")
    # vLLM rebuilds the previous turn from its output messages alone (its reasoning left out), so the
    # prompt departs from turn 1's prompt + generation where the reasoning was; the request sends
    # no model-authored item back, so lineage takes it as a root, and the rollout has two.
    assert second.prompt_token_ids[:len(first.prompt_token_ids)] == first.prompt_token_ids
    assert second.prompt_token_ids[len(first.prompt_token_ids)] != first.generation_token_ids[0]
    assert second.link == "root"
    build = trajectories(capture_dir, "by-id")
    assert build.masked and build.mask_reason == "2 roots and 2 chains, not one"
    assert verdicts_of_records(capture_dir, "by-id") == verdicts_of_builder(capture_dir, "by-id")
    unknown = await fetch(http, "POST", rollout_url(sidecar.url, "by-id-2", "/v1/responses"),
                          orjson.dumps({"model": "m", "input": "hi", "previous_response_id": "resp_nowhere"}))
    assert unknown.status == 404 and b"resp_nowhere" in unknown.body




@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_reply_the_stand_in_aborts_is_resumed_into_one_chain(http, stand_in, start, capture_dir, stream):
    """``X-Stand-In-Abort: after-reasoning`` stops a reply after its reasoning, as vLLM aborts
    around a weight update; the agent resumes it with ``continue_final_message``, and the resumed
    call continues the aborted one's prompt + partial generation exactly."""
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    url = rollout_url(sidecar.url, "aborted", "/v1/chat/completions")
    question = [{"role": "user", "content": "Say hello."}]
    first = await fetch(http, "POST", url, orjson.dumps({"model": "m", "messages": question, "stream": stream}),
                        headers={"Content-Type": "application/json", "X-Stand-In-Abort": "after-reasoning"})
    assert b'"finish_reason":"abort"' in first.body
    resume = {"model": "m", "messages": [*question, {"role": "assistant", "content": ""}], "stream": stream,
              "continue_final_message": True, "add_generation_prompt": False}
    assert (await fetch(http, "POST", url, orjson.dumps(resume), headers={"Content-Type": "application/json"})).status == 200
    aborted, resumed = read_token_records(capture_dir, "aborted")
    assert not aborted.usable and resumed.resumes == aborted.model_call_id
    assert resumed.prompt_token_ids == aborted.prompt_token_ids + aborted.generation_token_ids
    build = trajectories(capture_dir, "aborted")
    assert not build.masked, build.mask_reason
    assert verdicts_of_records(capture_dir, "aborted") == verdicts_of_builder(capture_dir, "aborted")
