"""vLLM's token-in/token-out path, ``POST /inference/v1/generate``, captured as a dialect (docs/wire.md):
the agent's bytes unchanged, streamed and not; the line's record and token records read the explicit
arrays (the prompt is the request's own ids); the stream rebuilt as the JSON reply; the abort path
forwarded and never counted as a call. The stand-in answers with vLLM's shapes
(``scale_out/token_in_token_out/protocol.py`` and ``serving.py``)."""

from __future__ import annotations

import random

import orjson
import pytest

from capture import StreamTap
from proxy.standin.replies import generate_events, generate_reply
from records import read_model_call_records, read_token_records
from tests.wire import fetch, rollout_url

PROMPT = [101, 7, 4242, 9, 15]


def _request(stream: bool, **extra) -> bytes:
    body = {"token_ids": PROMPT, "sampling_params": {"max_tokens": 6, "logprobs": 0, "temperature": 1.0}, **extra}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return orjson.dumps(body)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_generate_call_is_captured_with_its_arrays(http, stand_in, start, capture_dir, store, stream):
    sidecar = await start(stand_in.url, capture_dir=capture_dir)
    body = _request(stream)
    direct = await fetch(http, "POST", stand_in.url + "/inference/v1/generate", body)
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "tito", "/inference/v1/generate"), body)
    assert (proxied.status, proxied.body) == (direct.status, direct.body), "the agent's bytes are the upstream's"
    (line,) = store.read("tito")
    assert line["dialect"] == "generate" and line["error_category"] is None
    (record,) = read_model_call_records(store, "tito")
    assert (record.dialect, record.finish_reason, record.tokens_in, record.tokens_out) == ("generate", "length", 5, 6)
    (tokens,) = read_token_records(store, "tito")
    expected = generate_reply(0, 0, PROMPT, f"Hello from the stand-in model. You sent {len(PROMPT)} prompt tokens.", 6,
                              True, False)["choices"][0]
    assert tokens.prompt_token_ids == PROMPT, "the prompt is the request's own ids"
    assert tokens.generation_token_ids == expected["token_ids"]
    assert tokens.generation_log_probs == [entry["logprob"] for entry in expected["logprobs"]["content"]]
    assert tokens.usable, tokens.unusable_reason


def _reply() -> dict:
    return generate_reply(3, 1767225600, PROMPT, "one two three four five six seven", None, True, True)


def _rebuilt(pieces: list[bytes]) -> dict:
    tap = StreamTap("generate")
    ends = [tap.feed(piece) for piece in pieces]
    assert ends.count(True) == 1 and ends[-1] is True, "the reply ends at [DONE], once"
    outcome = tap.finish(200)
    assert outcome.error_category is None and outcome.response is not None
    return outcome.response


def test_the_stream_is_rebuilt_as_the_json_reply_whole_byte_by_byte_and_at_random_splits():
    reply = _reply()
    body = b"".join(generate_events(reply, include_usage=True))
    want = {key: value for key, value in reply.items() if key != "created" and key != "model" and value is not None}
    want["choices"] = [{key: value for key, value in choice.items() if value is not None} for choice in reply["choices"]]
    rng = random.Random(5)
    splits = {"whole": [body], "byte by byte": [body[i:i + 1] for i in range(len(body))]}
    for attempt in range(20):
        cuts = sorted(rng.sample(range(1, len(body)), 12))
        splits[f"random {attempt}"] = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]
    for name, pieces in splits.items():
        assert _rebuilt(pieces) == want, name


async def test_the_abort_path_is_forwarded_and_never_a_call(http, stand_in, start, capture_dir, store):
    sidecar = await start(stand_in.url, capture_dir=capture_dir)
    direct = await fetch(http, "POST", stand_in.url + "/inference/v1/abort_requests", b'{"request_ids": ["x"]}')
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "tito", "/inference/v1/abort_requests"),
                          b'{"request_ids": ["x"]}')
    assert (proxied.status, proxied.body) == (direct.status, direct.body)
    assert store.rollout_ids() == [], "no line: an abort is not a model call"
