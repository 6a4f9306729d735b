"""Multi-turn token drift (issue 20): does each prompt begin with an earlier call's prompt + generation?"""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from proxy import main
from records import read_token_records

from tests.wire import fetch, rollout_url


def _line(prompt: list[int], generated: list[int], n: int = 1, category: str | None = None) -> bytes:
    choices = [{"index": i, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop",
                "token_ids": [g + i for g in generated], "logprobs": {"content": [{"token": "x", "logprob": -0.5}] * len(generated)}}
               for i in range(n)]
    return orjson.dumps({"model_call_id": "c", "dialect": "chat", "status_code": 200, "error_category": category,
                         "response": {"object": "chat.completion", "choices": choices, "prompt_token_ids": prompt}}) + b"\n"


def _records(tmp_path, *lines: bytes):
    (tmp_path / "r.capture.jsonl").write_bytes(b"".join(lines))
    return read_token_records(str(tmp_path), "r")


def test_a_turn_that_begins_with_the_last_prompt_and_generation_extends_it(tmp_path):
    first, second, third = _records(tmp_path, _line([1, 2, 3], [4, 5]), _line([1, 2, 3, 4, 5, 6], [7]),
                                    _line([1, 2, 3, 4, 5, 6, 7, 8], [9]))
    assert (first.extends, first.drift_at) == (None, None)
    assert (second.extends, second.drift_at) == (0, None)
    assert (third.extends, third.drift_at) == (1, None), "the latest call it begins with"


def test_a_turn_whose_template_dropped_the_reasoning_drifts_where_it_departs(tmp_path):
    # The first generation was [reasoning 40, 41] + [answer 50]; the next prompt renders only the answer.
    first, second = _records(tmp_path, _line([1, 2, 3], [40, 41, 50]), _line([1, 2, 3, 50, 2, 9], [7]))
    assert (second.extends, second.drift_at) == (None, 3)


def test_an_unrelated_prompt_neither_extends_nor_drifts(tmp_path):
    _, second = _records(tmp_path, _line([1, 2, 3], [4]), _line([8, 9], [4]))
    assert (second.extends, second.drift_at) == (None, None)


def test_the_closest_earlier_call_gives_the_drift(tmp_path):
    records = _records(tmp_path, _line([5], [1]), _line([5, 6], [7, 8]), _line([5, 6, 7, 9], [1]))
    assert (records[2].extends, records[2].drift_at) == (None, 3), "call 1 shares 3 tokens, call 0 one"


def test_the_other_choices_of_one_call_are_not_earlier_turns(tmp_path):
    records = _records(tmp_path, _line([1, 2], [3], n=2), _line([1, 2, 4], [5]))
    assert [r.choice_index for r in records] == [0, 1, 0]
    assert (records[0].extends, records[1].extends, records[1].drift_at) == (None, None, None)
    assert records[2].extends == 0, "choice 1 generated [4]: the second call extends call 0's second choice"


async def test_the_stand_in_shows_drift_in_show_stats_and_report(http, stand_in, start, capture_dir, store, tmp_path):
    """The stand-in's drop-reasoning template leaves out the reasoning of earlier turns (as Qwen3's
    does): a second turn departs from the first where its reasoning began, and every view says so."""
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True, supply_prefix=False)  # The drift shows without supply.
    drops = {"X-Stand-In-Template": "drop-reasoning"}
    first = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "talk", "/v1/chat/completions"), orjson.dumps(first),
                        headers=drops)
    said = orjson.loads(reply.body)["choices"][0]["message"]["content"]
    second = {"model": "m", "messages": [*first["messages"], {"role": "assistant", "content": said},
                                        {"role": "user", "content": "again"}]}
    await fetch(http, "POST", rollout_url(sidecar.url, "talk", "/v1/chat/completions"), orjson.dumps(second),
                headers=drops)
    earlier, later = read_token_records(store, "talk")
    assert later.extends is None and later.drift_at == len(earlier.prompt_token_ids)
    runner = CliRunner()
    shown = runner.invoke(main, ["show", capture_dir, "talk"]).output
    assert "usable" in shown.splitlines()[1] and f"drifts at {later.drift_at}" in shown.splitlines()[2]
    stats = runner.invoke(main, ["stats", capture_dir]).output
    assert "2 of 2 generations with token ids usable" in stats and "drifting from one 1" in stats
    report = tmp_path / "report.html"
    assert runner.invoke(main, ["report", capture_dir, "-o", str(report)]).exit_code == 0
    assert f"prompt drifts at token {later.drift_at} from call #0" in report.read_text(encoding="utf-8")
    pq = pytest.importorskip("pyarrow.parquet", reason="Parquet export needs the 'export' extra (pyarrow)")
    exported = tmp_path / "calls.parquet"
    assert runner.invoke(main, ["export", capture_dir, "--format", "parquet", "--token-arrays", "-o", str(exported)]).exit_code == 0
    table = pq.read_table(exported).to_pylist()
    assert [(row["usable"], row["extends"], row["drift_at"]) for row in table] == [(True, None, None), (True, None, later.drift_at)]


def _chat_line(prompt: list[int], generated: list[int], messages: list[dict], reply: str = "x") -> bytes:
    line = orjson.loads(_line(prompt, generated))
    line["request"] = {"model": "m", "messages": messages}
    line["response"]["choices"][0]["message"]["content"] = reply
    return orjson.dumps(line) + b"\n"


SYSTEM, ASK = {"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}


def test_a_new_conversation_sharing_only_the_system_prompt_is_not_drift(tmp_path):
    """Issue 31, point 5: drift only where a call claims to continue another. A second, fresh
    conversation of the rollout (no model-authored turn) is a root, whatever ids it shares."""
    first, fresh = _records(tmp_path, _chat_line([1, 2, 3], [4, 5], [SYSTEM, ASK]),
                            _chat_line([1, 2, 9], [4], [SYSTEM, {"role": "user", "content": "another"}]))
    assert (fresh.extends, fresh.drift_at, fresh.drift_from) == (None, None, None)


def test_a_call_that_sends_back_a_reply_drifts_from_that_call_only(tmp_path):
    """The request sends back call 1's reply: its prompt is measured against call 1 (not the closest
    sequence of the rollout), and says so."""
    records = _records(
        tmp_path, _chat_line([5], [1, 2, 3], [ASK], reply="a"), _chat_line([7], [8], [{"role": "user", "content": "z"}], "b"),
        _chat_line([5, 1, 2, 4], [6], [ASK, {"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]))
    assert (records[2].extends, records[2].drift_at, records[2].drift_from) == (None, 3, 0)
    extending = _records(tmp_path, _chat_line([5], [1], [ASK], reply="a"),
                         _chat_line([5, 1, 6], [2], [ASK, {"role": "assistant", "content": "a"}, ASK]))
    assert (extending[1].extends, extending[1].drift_at) == (0, None)


def test_a_request_without_turns_keeps_the_prefix_rule(tmp_path):
    """Completions (a prompt of ids, no turns): whether it continues a call is read from the ids."""
    line = orjson.loads(_line([1, 2], [3]))
    line["request"] = {"model": "m", "prompt": [1, 2]}
    later = orjson.loads(_line([1, 2, 3, 4], [5]))
    later["request"] = {"model": "m", "prompt": [1, 2, 3, 4]}
    _, second = _records(tmp_path, orjson.dumps(line) + b"\n", orjson.dumps(later) + b"\n")
    assert second.extends == 0


async def test_the_stand_ins_default_template_chains_turns(http, stand_in, start, capture_dir, store):
    """Issue 31, point 6: by default a sent-back assistant turn renders as exactly its generated ids
    (a tool call and its result included), so every turn extends the last and the rollout is one
    unmasked trajectory."""
    from records import trajectories
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True, supply_prefix=False)  # The template alone chains.
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    for _ in range(3):
        reply = await fetch(http, "POST", rollout_url(sidecar.url, "chain", "/v1/chat/completions"),
                            orjson.dumps({"model": "m", "messages": messages, "tools": tools}))
        message = orjson.loads(reply.body)["choices"][0]["message"]
        messages.append({key: message[key] for key in ("role", "content", "tool_calls") if message.get(key) is not None})
        for call in message.get("tool_calls") or ():
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "sunny, 22 C"})
        messages.append({"role": "user", "content": "and tomorrow?"}) if not message.get("tool_calls") else None
    records = read_token_records(store, "chain")
    assert [(r.extends, r.drift_at) for r in records] == [(None, None), (0, None), (1, None)]
    build = trajectories(capture_dir, "chain")
    assert not build.masked, build.mask_reason
    assert [c.model_call_id for c in build.main.calls] == [r.model_call_id for r in records]
