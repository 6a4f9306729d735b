"""`/v1/completions`, the fourth dialect (issue 20): reassembly of vLLM-shaped streams (whole, byte by
byte, at random points, event by event), records, training arrays, and the inspection commands."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from proxy import main
from proxy.standin.replies import Plan, TokenOptions, completions_events, completions_reply, text_token_ids
from records import build_model_call_record, read_model_call_records, read_token_records

from tests.capture.test_reassembly import run_everywhere
from tests.wire import fetch, rollout_url

_PLAN = Plan("", "def add(a, b): return a + b", None, "", "call_1", 12, 0)


def _stream_and_whole(prompts: list[list[int]], n: int, tokens: TokenOptions) -> tuple[bytes, dict]:
    whole = completions_reply(_PLAN, 7, 1767225600, prompts, n, tokens)
    return b"".join(completions_events(whole, include_usage=True, tokens=tokens)), whole


@pytest.mark.parametrize("tokens", [TokenOptions(), TokenOptions(True, 1, True), TokenOptions(True, 3, True, True)],
                         ids=["plain", "logprobs-and-ids", "top3-as-token-ids"])
@pytest.mark.parametrize("n", [1, 2])
def test_a_stream_reassembles_to_the_whole_reply(tokens, n):
    """Choices interleaved as vLLM sends n > 1; text, the completions logprobs lists, token ids and
    the per-choice prompt ids come out as the non-streamed reply has them."""
    stream, whole = _stream_and_whole([text_token_ids("def add(a, b):")], n, tokens)
    outcome = run_everywhere("completions", stream)
    assert outcome.error_category is None and outcome.stream_truncated is False
    rebuilt = outcome.response
    assert rebuilt["object"] == "text_completion" and rebuilt["usage"] == whole["usage"]
    for mine, expected in zip(rebuilt["choices"], whole["choices"], strict=True):
        for key in ("index", "text", "finish_reason", "token_ids", "prompt_token_ids", "logprobs"):
            assert mine[key] == expected[key], key


def test_several_prompts_give_a_choice_each():
    stream, whole = _stream_and_whole([[1, 2, 3], [4, 5]], 1, TokenOptions(False, 0, True))
    rebuilt = run_everywhere("completions", stream).response
    assert [choice["prompt_token_ids"] for choice in rebuilt["choices"]] == [[1, 2, 3], [4, 5]]


def test_an_error_event_ends_the_reply_as_an_error():
    error = b'data: {"error": {"message": "boom", "type": "BadRequestError", "param": null, "code": 400}}\n\n'
    outcome = run_everywhere("completions", error + b"data: [DONE]\n\n")
    assert outcome.error_category == "upstream_error" and outcome.stream_truncated is False


def test_a_cut_stream_is_truncated_and_its_generation_not_usable(tmp_path):
    stream, _ = _stream_and_whole([[1, 2]], 1, TokenOptions(True, 1, True))
    cut = b"\n\n".join(stream.split(b"\n\n")[:4]) + b"\n\n"
    outcome = run_everywhere("completions", cut)
    assert outcome.error_category == "stream_truncated"
    line = {"model_call_id": "c", "dialect": "completions", "status_code": 200, "error_category": "stream_truncated",
            "response": outcome.response}
    (tmp_path / "r.capture.jsonl").write_bytes(orjson.dumps(line) + b"\n")
    (record,) = read_token_records(str(tmp_path), "r")
    assert record.generation_token_ids and not record.usable and "stream_truncated" in record.unusable_reason


def test_a_record_of_a_completion():
    _, whole = _stream_and_whole([[1, 2, 3]], 2, TokenOptions(True, 1, True))
    record = build_model_call_record({"dialect": "completions", "status_code": 200, "response": whole}, 0)
    assert (record.dialect, record.finish_reason, record.tokens_in, record.tokens_out) == ("completions", "stop", 3, 14)
    assert record.tool_calls == [] and [op.kind for op in record.model_operations] == ["text", "text"]


async def test_captured_through_the_sidecar_and_seen_by_the_cli(http, stand_in, sidecar_on_stand_in, store, capture_dir):
    for body in ({"model": "m", "prompt": "def add(a, b):"},
                 {"model": "m", "prompt": [5, 6, 7], "stream": True, "logprobs": 0, "return_token_ids": True}):
        reply = await fetch(http, "POST", rollout_url(sidecar_on_stand_in.url, "cmp", "/v1/completions"), orjson.dumps(body))
        assert reply.status == 200
    records = read_model_call_records(store, "cmp")
    assert [(r.dialect, r.error_category, r.finish_reason) for r in records] == [("completions", None, "stop")] * 2
    (_, tokens) = read_token_records(store, "cmp")
    assert tokens.usable and tokens.prompt_token_ids == [5, 6, 7]
    runner = CliRunner()
    shown = [row for row in runner.invoke(main, ["show", capture_dir, "cmp"]).output.splitlines()
             if not row.startswith(("in/out", "  "))]  # The table; then why a count is missing, if one is.
    assert [row.split()[:2] for row in shown[1:]] == [["0", "completions"], ["1", "completions"]]
    assert shown[1].split()[-1] == "-" and shown[2].split()[-1] == "usable", "arrays only where asked for"
    stats = runner.invoke(main, ["stats", capture_dir]).output
    assert "finish reasons      stop 2" in stats and "1 of 1 generations with token ids usable" in stats


async def test_the_stand_in_honours_max_tokens_and_n_and_answers_each_prompt(http, stand_in):
    """Issue 33, point 9: ``max_tokens`` cuts each choice (``length``), ``n`` gives that many
    samples of each prompt, a token-id prompt is answered by its length, several prompts each get
    their own answer; streamed, the same reply (as vLLM)."""
    async def complete(**body):
        reply = await fetch(http, "POST", stand_in.url + "/v1/completions", orjson.dumps({"model": "m", **body}))
        return reply.status, orjson.loads(reply.body) if reply.status != 200 or not body.get("stream") else reply.body

    _, whole = await complete(prompt="def add(a, b):")
    (choice,) = whole["choices"]
    assert choice["text"] == "Hello from the stand-in model. You said: def add(a, b):" and choice["finish_reason"] == "stop"
    _, cut = await complete(prompt="def add(a, b):", max_tokens=3, n=3, return_token_ids=True)
    assert [c["index"] for c in cut["choices"]] == [0, 1, 2]
    assert {(c["text"], c["finish_reason"], len(c["token_ids"])) for c in cut["choices"]} == {("Hello from the ", "length", 3)}
    assert cut["usage"]["completion_tokens"] == 9
    _, ids = await complete(prompt=[[5, 6, 7], [8, 9]], return_token_ids=True)
    assert [c["text"] for c in ids["choices"]] == ["Hello from the stand-in model. You sent 3 prompt tokens.",
                                                    "Hello from the stand-in model. You sent 2 prompt tokens."]
    assert [c["prompt_token_ids"] for c in ids["choices"]] == [[5, 6, 7], [8, 9]] and ids["usage"]["prompt_tokens"] == 5
    _, texts = await complete(prompt=["one", "two"], n=2)
    assert [c["text"].rsplit(" ", 1)[-1] for c in texts["choices"]] == ["one", "one", "two", "two"]
    request = {"prompt": ["one", "two two two"], "n": 2, "max_tokens": 9, "logprobs": 0, "return_token_ids": True}
    _, whole = await complete(**request)
    _, stream = await complete(**request, stream=True, stream_options={"include_usage": True})
    rebuilt = run_everywhere("completions", stream).response
    assert rebuilt["usage"] == whole["usage"]
    for mine, expected in zip(rebuilt["choices"], whole["choices"], strict=True):
        for key in ("index", "text", "finish_reason", "token_ids", "prompt_token_ids", "logprobs"):
            assert mine[key] == expected[key], key
    for bad in ({"n": 0}, {"n": 17}, {"n": "2"}, {"max_tokens": 0}, {"max_tokens": True}):
        status, error = await complete(prompt="x", **bad)
        assert status == 400 and error["error"]["code"] == 400, bad


@pytest.fixture
async def sidecar_on_stand_in(start, stand_in, capture_dir):
    return await start(stand_in.url, capture_dir=capture_dir)
