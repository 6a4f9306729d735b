"""Side calls (issue 71, point 6; docs/tokens.md, "Side calls"): a call for another model than the
rollout's policy model, or a harness's title or quota call, is captured whole and marked, counted,
and left out of every token-file chain, trajectory and consumer item; the main chain is unchanged."""

from __future__ import annotations

import asyncio

import orjson
from click.testing import CliRunner

from proxy import main
from records import Consumer, end_rollout, read_model_call_records, read_token_entries, trajectories
from records.contract import TokenFiles
from tests.proxy.app.test_metrics_and_logs import scrape, value
from tests.proxy.training.test_token_files import SYSTEM, converse, serve_model
from tests.scripted_upstream import sse_script
from tests.transcripts import MESSAGES_STREAM
from tests.vllm_chat_model import TinyChatModel
from tests.wire import assert_same_reply, fetch, rollout_url

#: Claude Code 2.1.197's title call, as it went through the sidecar in the harness tier (`make
#: harness-e2e`; `tests/harness_e2e`), shortened: its system prompt's first sentence and its output
#: format as sent. Its main turns carry 25 tools and its own system prompt; this one none.
CLAUDE_CODE_TITLE_CALL = {
    "model": "claude-sonnet-4-5",
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.d55; cc_entrypoint=sdk-cli;"},
               {"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK."},
               {"type": "text", "text": "Generate a concise, sentence-case title (3-7 words) that captures the main "
                                        "topic or goal of this coding session."}],
    "tools": [], "max_tokens": 32000, "thinking": {"type": "disabled"}, "temperature": 1,
    "output_config": {"format": {"type": "json_schema", "schema": {
        "type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"],
        "additionalProperties": False}}},
    "messages": [{"role": "user", "content": [{"type": "text", "text": "<session>\nWhat is the weather in Paris?\n</session>"}]}],
    "stream": True,
}
CLAUDE_CODE_QUOTA_CALL = {"model": "claude-haiku-4-5", "max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]}
CLAUDE_CODE_TURN = {"model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": True,
                    "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
                    "system": [{"type": "text", "text": "You are an interactive agent that helps users."}],
                    "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}


async def test_a_call_for_another_model_is_kept_marked_counted_and_never_in_a_chain(http, upstream, start, capture_dir,
                                                                                   store):
    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    await converse(http, sidecar, "plain", ["hi", "more"])
    # The same conversation, with a side call to a helper model between its turns.
    messages = [SYSTEM, {"role": "user", "content": "hi"}]
    first = await fetch(http, "POST", rollout_url(sidecar.url, "aside", "/v1/chat/completions"),
                        orjson.dumps({"model": "m", "messages": messages}))
    messages.append({"role": "assistant", "content": orjson.loads(first.body)["choices"][0]["message"]["content"]})
    side_request = orjson.dumps({"model": "helper-small", "messages": [{"role": "user", "content": "Summarise: hi"}]})
    side = await fetch(http, "POST", rollout_url(sidecar.url, "aside", "/v1/chat/completions"), side_request)
    assert side.status == 200
    assert upstream.received[-1].body == side_request, "the side call went upstream as the agent sent it"
    messages.append({"role": "user", "content": "more"})
    assert (await fetch(http, "POST", rollout_url(sidecar.url, "aside", "/v1/chat/completions"),
                        orjson.dumps({"model": "m", "messages": messages}))).status == 200
    lines = store.read("aside")
    assert [line.get("side_call") for line in lines] == [None, {"reason": "other_model"}, None], "captured whole, marked"
    assert lines[1]["response"]["choices"][0]["message"]["content"], "its reply is on the line"
    assert [record.side_call for record in read_model_call_records(capture_dir, "aside")] == [None, "other_model", None]
    entries = read_token_entries(capture_dir, "aside")
    assert [entry["model_call_id"] for entry in entries] == [lines[0]["model_call_id"], lines[2]["model_call_id"]]
    assert lines[1]["model_call_id"] not in TokenFiles(capture_dir).intents("aside"), "no intent: never a lost call"
    plain, aside = trajectories(capture_dir, "plain"), trajectories(capture_dir, "aside")
    assert not aside.masked and len(aside.chains) == len(plain.chains) == 1
    for field in ("token_ids", "loss_mask", "logprobs"):
        assert getattr(aside.main, field) == getattr(plain.main, field), f"the main chain is unchanged: {field}"
    assert value(await scrape(http, sidecar), "mcc_side_calls_total", reason="other_model") == 1
    loop = asyncio.get_running_loop()
    for rollout_id in ("plain", "aside"):
        await loop.run_in_executor(None, lambda rollout_id=rollout_id: end_rollout(capture_dir, rollout_id))
    trainer = Consumer(capture_dir, "trainer")
    taken = await loop.run_in_executor(None, lambda: trainer.take(2, wait=3.0))
    taken += await loop.run_in_executor(None, lambda: trainer.take(2, wait=3.0 if len(taken) < 2 else 0.0))
    (item,) = [item for item in taken if item.rollout_id == "aside"]
    assert item.trajectories.model_dump() == aside.model_dump() and len(item.calls) == 3
    stats = orjson.loads(CliRunner().invoke(main, ["stats", capture_dir, "--json"]).output)
    assert stats["side_calls"] == {"other_model": 1}
    assert stats["turns_per_rollout"]["max"] == 2, "a side call is not a turn"
    listed = {row["rollout_id"]: row for row in map(orjson.loads, CliRunner().invoke(main, ["ls", capture_dir, "--json"])
                                                  .output.splitlines())}
    assert (listed["aside"]["calls"], listed["aside"]["turns"]) == (3, 2)


async def test_claude_codes_title_and_quota_calls_as_recorded_are_side_calls(http, upstream, start, capture_dir, store):
    upstream.scripts["/v1/messages"] = sse_script(MESSAGES_STREAM)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    for request in (CLAUDE_CODE_TITLE_CALL, CLAUDE_CODE_TURN, CLAUDE_CODE_QUOTA_CALL, CLAUDE_CODE_TURN):
        body = orjson.dumps(request)
        direct = await fetch(http, "POST", upstream.url + "/v1/messages", body)
        assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, "claude", "/v1/messages"), body))
    assert [line.get("side_call") for line in store.read("claude")] == [
        {"reason": "title"}, None, {"reason": "quota"}, None], "the title call first: the policy is the turns' model"
    samples = await scrape(http, sidecar)
    assert value(samples, "mcc_side_calls_total", reason="title") == 1
    assert value(samples, "mcc_side_calls_total", reason="quota") == 1


async def test_the_policy_model_named_decides_and_a_turn_is_never_marked(http, upstream, start, capture_dir, store):
    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=capture_dir, policy_model="policy-v2")
    for model in ("judge", "policy-v2", "policy-v2"):
        assert (await fetch(http, "POST", rollout_url(sidecar.url, "named", "/v1/chat/completions"),
                            orjson.dumps({"model": model, "messages": [SYSTEM, {"role": "user", "content": "hi"}]}))
                ).status == 200
    assert [line.get("side_call") for line in store.read("named")] == [{"reason": "other_model"}, None, None]
