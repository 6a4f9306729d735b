"""The token capture mode under real-world bytes (issue 30, points 1-8): what the agent receives is
what vLLM sends for the agent's own request, derived from a model of vLLM (`vllm_chat_model`), never
from the cutter; every framing the SSE rules allow, whole, byte by byte and at random splits, in
the tap (one reader for the capture and the cut) and in the cutter alone; then, through the
sidecar against a scripted upstream, refusals, compressed replies and sized streams."""

from __future__ import annotations

import gzip
import random
from typing import Callable

import orjson
import pytest

from capture import AddedFieldCutter, CuttingStreamTap, StreamTap, token_fields_to_add, vllm_bool
from proxy.training import refused_fields
from tests.scripted_upstream import Script, json_script, split_every, sse_script
from tests.capture_outcomes import outcome_with_cut_entries
from tests.vllm_chat_model import (EMPTY, FRAMINGS, SPELLINGS, Token, chat_payloads, mistral_tool_call_tokens,
                                   named_events, responses_payloads, spelt, text_tokens)
from tests.wire import fetch, rollout_url

CHAT = {"model": "m", "messages": [{"role": "user", "content": "add 1 and 2"}], "stream": True}
#: Generations, per choice: plain text, tokens a parser holds back, Mistral's own empty deltas, n = 2.
GENERATIONS = {
    "text": [text_tokens("Hel", "lo", " there", "!")],
    "held-back": [[Token(7, "<think>", -0.1, None), *text_tokens("hi", "!"), Token(8, "\xef", -0.3, None),
                   Token(9, "\xbf", -0.3, {"content": "\u00ff"}), Token(10, "</s>", -0.1, None)]],
    "mistral-tools": [mistral_tool_call_tokens()],
    "n2": [text_tokens("a", "b"), [Token(20, "<x>", -0.5, None), *text_tokens("c", "d", "e", start_id=200)]],
}
USAGE = {"no-usage": {}, "include-usage": {"include_usage": True},
         "continuous-usage": {"include_usage": True, "continuous_usage": True}}


def splits(data: bytes, seed: int) -> dict[str, list[bytes]]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, 24)))
    return {"whole": [data], "1-byte": split_every(data, 1), "2-byte": split_every(data, 2), "7-byte": split_every(data, 7),
            "random": [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]}


def through_tap(dialect: str, added: dict, request: dict, pieces: list[bytes]) -> tuple[bytes, StreamTap]:
    """What the proxy sends the agent: each piece through the tap's one reader, then the end."""
    tap = CuttingStreamTap(dialect, cutter=AddedFieldCutter(dialect, added, request))
    out = []
    for piece in pieces:
        tap.feed(piece)
        out.append(tap.take_output())
    return b"".join(out) + tap.close_output(), tap


def through_cutter(dialect: str, added: dict, request: dict, pieces: list[bytes]) -> bytes:
    cutter = AddedFieldCutter(dialect, added, request)
    return b"".join(cutter.feed(piece) for piece in pieces) + cutter.close()


def assert_cut_at_every_split(added: dict, request: dict, sent: bytes, expected: bytes, seed: int) -> None:
    """``sent`` (a chat stream with ``added``'s arrays) cut to ``expected`` at every split, by the
    tap and by the cutter alone; the capture the same as without the cutter."""
    for split, pieces in splits(sent, seed=seed).items():
        cut, tap = through_tap("chat", added, request, pieces)
        assert cut == expected, (split, cut, expected)
        assert through_cutter("chat", added, request, pieces) == expected, split
        alone = StreamTap("chat")
        for piece in pieces:
            alone.feed(piece)
        assert outcome_with_cut_entries(tap) == alone.finish(200), "the capture is the same with the cutter inside"


@pytest.mark.parametrize("framing", list(FRAMINGS))
@pytest.mark.parametrize("usage", list(USAGE))
@pytest.mark.parametrize("generation", list(GENERATIONS))
def test_the_agent_gets_vllms_reply_to_its_own_request_in_every_framing(generation, usage, framing):
    """Held-back tokens' chunks dropped (with usage on them too), Mistral's own empty deltas kept,
    every SSE framing cut (CR, CRLF, ``\\n\\r\\n``, ``\\r\\n\\r``, a BOM, comments holding ``data:``,
    data over several lines, an unterminated last event), at every split; the capture is the same."""
    choices, options = GENERATIONS[generation], USAGE[usage]
    request = {**CHAT, "n": len(choices)}
    added = token_fields_to_add("chat", request)
    assert added == {"logprobs": True, "return_token_ids": True, "return_weight_versions": True}
    frame = FRAMINGS[framing]
    expected = frame(chat_payloads(choices, logprobs=False, token_ids=False, **options))
    sent = frame(chat_payloads(choices, logprobs=True, token_ids=True, **options))
    assert sent != expected
    assert_cut_at_every_split(added, request, sent, expected, seed=len(framing) + len(generation))


@pytest.mark.parametrize("spelling", [name for name in SPELLINGS if name != "compact"])
@pytest.mark.parametrize("framing", ["lf", "crlf"])
@pytest.mark.parametrize("usage", list(USAGE))
@pytest.mark.parametrize("generation", list(GENERATIONS))
def test_json_written_otherwise_is_cut_as_vllms_compact_json(generation, usage, framing, spelling):
    """The same chunks written with spaces around colons and commas (Python's ``json``) or with
    ``\\u``-escaped keys: every chunk kind (text, held-back tokens' token-only chunks with usage on
    them, Mistral's own empty deltas, n = 2, the usage chunk) comes out as the agent's own reply in
    that spelling, at every split; token-only chunks are dropped however they are written."""
    choices, options = GENERATIONS[generation], USAGE[usage]
    request = {**CHAT, "n": len(choices)}
    added = token_fields_to_add("chat", request)
    frame = FRAMINGS[framing]
    expected = frame(spelt(chat_payloads(choices, logprobs=False, token_ids=False, **options), spelling))
    sent = frame(spelt(chat_payloads(choices, logprobs=True, token_ids=True, **options), spelling))
    assert_cut_at_every_split(added, request, sent, expected, seed=len(spelling) + len(generation))


def test_a_token_only_chunk_spaced_before_its_colons_is_dropped():
    """The issue's reproduction: ``"delta" :{}`` (a space before each colon) is the chunk that
    exists only for a token's logprob; a direct call has no such chunk."""
    choices = [[*text_tokens("a"), Token(7, "<x>", -0.5, None), *text_tokens("b", start_id=300)]]
    expected = FRAMINGS["lf"](spelt(chat_payloads(choices, logprobs=False, token_ids=False), "space-before-colon"))
    sent = FRAMINGS["lf"](spelt(chat_payloads(choices, logprobs=True, token_ids=True), "space-before-colon"))
    assert b'"delta" :{}' in sent and b'"delta" :{}' not in expected
    for pieces in splits(sent, seed=3).values():
        assert through_tap("chat", {"logprobs": True, "return_token_ids": True}, CHAT, pieces)[0] == expected


def test_a_mistral_stream_keeps_exactly_the_parsers_own_empty_chunks():
    """The chunks of the held-back marker and JSON go; the closing token's and later ones stay."""
    choices = [mistral_tool_call_tokens()]
    own = chat_payloads(choices, logprobs=False, token_ids=False)
    assert sum(b'"delta":{}' in event for event in own) == 3  # "}]", " " and "</s>": the parser's own.
    cut, _ = through_tap("chat", {"logprobs": True, "return_token_ids": True}, CHAT,
                         [FRAMINGS["lf"](chat_payloads(choices, logprobs=True, token_ids=True))])
    assert cut == FRAMINGS["lf"](own)


def test_v11_mistral_tool_text_is_not_taken_for_closed_json():
    """``[TOOL_CALLS]name[ARGS]{...}`` (v11 tokenizers: the engine parser, which never sends an
    empty delta itself): its held-back chunks are dropped, brackets in ``[ARGS]`` notwithstanding."""
    tokens = [Token(9, "[TOOL_CALLS]", -0.1, None), Token(30, "add", -0.1, None), Token(31, "[ARGS]", -0.1, None),
              Token(32, '{"a": 3}', -0.1, {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 3}'}}]}),
              Token(33, " ", -0.1, None), Token(2, "</s>", -0.1, None)]
    expected = FRAMINGS["lf"](chat_payloads([tokens], logprobs=False, token_ids=False))
    cut, _ = through_tap("chat", {"logprobs": True, "return_token_ids": True}, CHAT,
                         [FRAMINGS["lf"](chat_payloads([tokens], logprobs=True, token_ids=True))])
    assert cut == expected


@pytest.mark.parametrize("written", ["false", "0", "off", 0])
def test_logprobs_false_as_vllm_reads_it_asks_for_nothing(written):
    """``"logprobs": "false"`` is False to vLLM (pydantic's lax bool): only the ids are added, and
    the held-back chunks that only the ids brought are dropped."""
    request = {**CHAT, "logprobs": written}
    added = token_fields_to_add("chat", request)
    assert added == {"return_token_ids": True, "return_weight_versions": True}
    choices = GENERATIONS["held-back"]
    expected = FRAMINGS["lf"](chat_payloads(choices, logprobs=False, token_ids=False))
    sent = FRAMINGS["lf"](chat_payloads(choices, logprobs=False, token_ids=True))
    for split, pieces in splits(sent, seed=3).items():
        assert through_tap("chat", added, request, pieces)[0] == expected, split


def test_what_the_agent_asked_for_keeps_its_chunks():
    """An agent that asked for logprobs itself gets the held-back chunks (with its logprobs), ids cut."""
    request = {**CHAT, "logprobs": "true"}
    added = token_fields_to_add("chat", request)
    choices = GENERATIONS["held-back"]
    expected = FRAMINGS["lf"](chat_payloads(choices, logprobs=True, token_ids=False))
    sent = FRAMINGS["lf"](chat_payloads(choices, logprobs=True, token_ids=True))
    assert through_tap("chat", added, request, [sent])[0] == expected


@pytest.mark.parametrize("dialect, request_body", [
    ("chat", {"top_logprobs": 2}),
    ("chat", {"top_logprobs": -1, "logprobs": False}),
    ("chat", {"top_logprobs": True}),
    ("chat", {"logprob_token_ids": [5, 6]}),
    ("completions", {"logprob_token_ids": [5]}),
    ("completions", {"echo": True}),
    ("completions", {"echo": "yes", "logprobs": 1}),
])
def test_nothing_is_added_where_it_would_change_the_verdict_or_the_reply(dialect, request_body):
    """vLLM refuses ``top_logprobs`` / ``logprob_token_ids`` without ``logprobs`` (a 400 the agent
    must get), and ``echo`` changes the reply with the fields (prompt text blanked, prompt logprobs)."""
    assert token_fields_to_add(dialect, {"model": "m", **request_body}) == {}


def test_a_valid_top_logprobs_request_still_gets_its_ids():
    assert token_fields_to_add("chat", {"model": "m", "logprobs": True, "top_logprobs": 2}) == {"return_token_ids": True, "return_weight_versions": True}
    assert token_fields_to_add("chat", {"model": "m", "top_logprobs": 0}) == {"logprobs": True, "return_token_ids": True,
                                                                                      "return_weight_versions": True}


@pytest.mark.parametrize("body, named", [
    (b'{"error":{"message":"`echo` with `logprobs` is not supported with beam search","type":"BadRequestError",'
     b'"param":"echo","code":400}}', []),
    (b'{"error":{"message":"bad return_token_ids","type":"BadRequestError","param":"return_token_ids","code":400}}',
     ["return_token_ids"]),
    (b'{"detail":[{"type":"extra_forbidden","loc":["body","return_token_ids"],"msg":"Extra inputs are not permitted"}]}',
     ["return_token_ids"]),
    (b'{"error":{"message":"Unrecognized request argument supplied: logprobs","param":null}}', ["logprobs"]),
    (b"Bad Request", ["logprobs", "return_token_ids"]),
])
def test_a_refusal_is_learnt_for_the_fields_it_names(body, named):
    assert refused_fields({"logprobs": True, "return_token_ids": True}, body) == named


def test_one_large_event_at_tiny_reads_is_cut_whole():
    """A 1.2 MB chunk (one long token and its logprob entry) in 64-byte reads comes out cut."""
    token = Token(5, "x" * 600_000, -0.5, {"content": "x" * 600_000})
    choices = [[*text_tokens("a"), token, *text_tokens("b", start_id=300)]]
    expected = FRAMINGS["lf"](chat_payloads(choices, logprobs=False, token_ids=False))
    sent = FRAMINGS["lf"](chat_payloads(choices, logprobs=True, token_ids=True))
    assert len(sent) > 1_200_000
    cut, tap = through_tap("chat", {"logprobs": True, "return_token_ids": True}, CHAT, split_every(sent, 64))
    assert cut == expected
    assert tap.finish(200).response["choices"][0]["message"]["content"] == "a" + "x" * 600_000 + "b"


@pytest.mark.parametrize("spelling", list(SPELLINGS))
@pytest.mark.parametrize("line_end", [b"\n", b"\r", b"\r\n"])
def test_a_responses_stream_is_cut_whatever_its_line_ends(line_end, spelling):
    """Responses deltas with CR-only line ends (and LF, CRLF), their JSON compact, spaced or with
    escaped keys: their logprobs cut to ``[]``, the part's and the response's to null, at every split."""
    request = {"model": "m", "input": "hi", "stream": True}
    added = token_fields_to_add("responses", request)

    def events(logprobs: bool) -> list[tuple[str, bytes]]:
        return [(name, SPELLINGS[spelling](orjson.loads(data))) for name, data in responses_payloads(["Hel", "lo", "!"], logprobs=logprobs)]

    expected = named_events(events(False), line_end)
    sent = named_events(events(True), line_end)
    assert sent != expected
    for split, pieces in splits(sent, seed=len(line_end)).items():
        assert through_tap("responses", added, request, pieces)[0] == expected, split


# -- through the sidecar --------------------------------------------------------------------------

def _added_request(request: dict) -> bytes:
    return orjson.dumps(request)[:-1] + b',"logprobs":true,"return_token_ids":true,"return_weight_versions":true}'


async def test_a_compressed_reply_leaves_the_mode_on(http, upstream, start, capture_dir, store):
    """A gzip 2xx (a gateway in front of vLLM) is resent as the agent's own request and counted, not
    learnt as a refusal: the next call still gets the fields, and an uncompressed reply is cut."""
    request = {**CHAT, "stream": False}
    plain_body = orjson.dumps({"id": "c", "object": "chat.completion", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "3"}, "logprobs": None, "finish_reason": "stop",
         "token_ids": None}], "prompt_token_ids": None})
    added_body = plain_body.replace(b'"logprobs":null', b'"logprobs":{"content":[{"token":"3","logprob":-0.1,'
                                    b'"bytes":[51],"top_logprobs":[]}]}').replace(b'"token_ids":null', b'"token_ids":[18]') \
        .replace(b'"prompt_token_ids":null', b'"prompt_token_ids":[1,2]')
    packed = gzip.compress(plain_body, mtime=0)
    compress = {"on": True}

    def respond(received):
        if compress["on"]:
            return Script(headers=[("Content-Type", "application/json"), ("Content-Encoding", "gzip"),
                                   ("Content-Length", str(len(packed)))], pieces=[packed])
        return json_script(added_body if b"return_token_ids" in received.body else plain_body)

    upstream.responder = respond
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    url = rollout_url(sidecar.url, "gz", "/v1/chat/completions")
    first = await fetch(http, "POST", url, orjson.dumps(request))
    assert first.status == 200 and first.body == packed
    assert [r.body for r in upstream.received] == [_added_request(request), orjson.dumps(request)]
    compress["on"] = False
    second = await fetch(http, "POST", url, orjson.dumps(request))
    assert upstream.received[-1].body == _added_request(request), "the mode is still on"
    assert second.body == plain_body
    lines = store.read("gz")
    assert "added_request_fields" not in lines[0] and lines[1]["added_request_fields"] == {
        "logprobs": True, "return_token_ids": True, "return_weight_versions": True}
    metrics = (await fetch(http, "GET", sidecar.url + "/-/metrics")).body.decode()
    assert "mcc_token_mode_compressed_replies_total 1.0" in metrics
    assert "mcc_token_fields_refused_total 0.0" in metrics


async def test_a_422_refusal_is_resent_and_learnt(http, upstream, start, capture_dir, store):
    """FastAPI's way (422, ``extra_forbidden`` at ``loc``) refuses ``return_token_ids``: the agent
    gets the reply to its own request; later calls get only ``logprobs``."""
    refusal = b'{"detail":[{"type":"extra_forbidden","loc":["body","return_token_ids"],"msg":"Extra inputs are not permitted"}]}'
    events = chat_payloads(GENERATIONS["text"], logprobs=False, token_ids=False)

    def respond(received):
        if b"return_token_ids" in received.body:
            return json_script(refusal, status=422, reason="Unprocessable Entity")
        asked = b'"logprobs":true' in received.body
        return sse_script(FRAMINGS["lf"](chat_payloads(GENERATIONS["text"], logprobs=asked, token_ids=False)))

    upstream.responder = respond
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    url = rollout_url(sidecar.url, "fastapi", "/v1/chat/completions")
    for _ in range(2):
        reply = await fetch(http, "POST", url, orjson.dumps(CHAT))
        assert reply.status == 200 and reply.body == FRAMINGS["lf"](events)
    assert [b"return_token_ids" in r.body for r in upstream.received] == [True, False, False]
    assert store.read("fastapi")[1]["added_request_fields"] == {"logprobs": True, "return_weight_versions": True}


async def test_an_invalid_request_gets_vllms_verdict(http, upstream, start, capture_dir):
    """``top_logprobs`` without ``logprobs``: a 400 directly, the same 400 through the mode."""
    refusal = b'{"error":{"message":"when using `top_logprobs`, `logprobs` must be set to true.","type":"BadRequestError","param":"top_logprobs","code":400}}'

    def respond(received):  # vLLM's check_logprobs.
        body = orjson.loads(received.body)
        if body.get("top_logprobs") and not body.get("logprobs"):
            return json_script(refusal, status=400, reason="Bad Request")
        return sse_script(FRAMINGS["lf"](chat_payloads(GENERATIONS["text"], logprobs=True, token_ids=True)))

    upstream.responder = respond
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    body = orjson.dumps({**CHAT, "top_logprobs": 2})
    direct = await fetch(http, "POST", upstream.url + "/v1/chat/completions", body)
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "bad", "/v1/chat/completions"), body)
    assert (proxied.status, proxied.body) == (direct.status, direct.body) == (400, refusal)
    assert upstream.received[-1].body == body


@pytest.mark.parametrize("split", [1, 7, 10_000])
async def test_a_sized_stream_whose_last_event_is_unterminated_is_cut_once(http, upstream, start, capture_dir, split):
    """An SSE reply with a Content-Length whose last event has no blank line: cut once, not twice."""
    expected = FRAMINGS["unterminated-last"](chat_payloads(GENERATIONS["text"], logprobs=False, token_ids=False))
    sent = FRAMINGS["unterminated-last"](chat_payloads(GENERATIONS["text"], logprobs=True, token_ids=True))
    upstream.responder = lambda received: Script(
        headers=[("Content-Type", "text/event-stream"), ("Content-Length", str(len(sent)))], pieces=split_every(sent, split))
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "sized", "/v1/chat/completions"), orjson.dumps(CHAT))
    assert reply.body == expected
    assert reply.header("content-length") == str(len(expected))


def vllm_upstream(framing: str, generation: str, usage: str, pieces: Callable[[bytes], list[bytes]]):
    """A scripted upstream that answers as the vLLM model does for the request it receives: token
    data only where that request asks for it (read as vLLM reads it)."""
    def respond(received):
        body = orjson.loads(received.body)
        sent = FRAMINGS[framing](chat_payloads(GENERATIONS[generation], logprobs=vllm_bool(body.get("logprobs")),
                                               token_ids=vllm_bool(body.get("return_token_ids")), **USAGE[usage]))
        return sse_script(sent, pieces=pieces(sent))
    return respond


#: (framing, generation, usage, the agent's own request) through the sidecar: issue 30's points 3, 5, 7, 8.
PROXY_CASES = {
    "continuous usage on held-back chunks": ("lf", "held-back", "continuous-usage", CHAT),
    "mistral's own empty deltas": ("lf", "mistral-tools", "include-usage", CHAT),
    "logprobs 'false'": ("lf", "held-back", "no-usage", {**CHAT, "logprobs": "false"}),
    "n=2": ("crlf", "n2", "include-usage", CHAT),
    **{f"framing {framing}": (framing, "mistral-tools", "include-usage", CHAT)
       for framing in ("cr", "crlf", "lf-then-crlf", "crlf-then-cr", "comment-holding-data", "bom", "multi-line-data",
                       "unterminated-last")},
}
PROXY_SPLITS = {"whole": lambda data: [data], "1-byte": lambda data: split_every(data, 1),
                "random": lambda data: list(splits(data, seed=len(data))["random"])}


@pytest.mark.parametrize("split", list(PROXY_SPLITS))
@pytest.mark.parametrize("case", list(PROXY_CASES))
async def test_through_the_sidecar_the_agent_gets_its_own_reply(http, upstream, start, capture_dir, store, case, split):
    """A scripted upstream modelled on vLLM, written whole, byte by byte and at random splits (chunked):
    the agent's bytes through the mode equal a direct call with its own request; the line has the arrays."""
    framing, generation, usage, request = PROXY_CASES[case]
    upstream.responder = vllm_upstream(framing, generation, usage, PROXY_SPLITS[split])
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    direct = await fetch(http, "POST", upstream.url + "/v1/chat/completions", orjson.dumps(request))
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "framed", "/v1/chat/completions"), orjson.dumps(request))
    assert b'"return_token_ids":true' in upstream.received[-1].body
    assert proxied.body == direct.body
    assert (proxied.status, proxied.headers) == (direct.status, direct.headers)
    (line,) = store.read("framed")
    assert line["added_request_fields"] and line["response"]["choices"], line


def test_empty_is_the_parsers_own_delta():
    assert EMPTY == {} and orjson.dumps(EMPTY) == b"{}"


async def test_an_event_that_cannot_be_cut_is_counted_and_said(http, upstream, start, capture_dir, caplog):
    """An ``id:`` line inside a value spread over data lines: the cut would remove it, so the event
    goes as it came -- counted in mcc_token_mode_uncut_events_total and said in the log, never silent."""
    events = chat_payloads(GENERATIONS["text"], logprobs=True, token_ids=True)
    first_token = events[1]
    at = first_token.index(b'"logprobs":{') + len(b'"logprobs":{')
    odd = b"data: " + first_token[:at] + b"\nid: 1\ndata: " + first_token[at:] + b"\n\n"
    sent = FRAMINGS["lf"](events[:1]) + odd + FRAMINGS["lf"](events[2:])
    upstream.responder = lambda received: sse_script(sent)
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "odd", "/v1/chat/completions"), orjson.dumps(CHAT))
    assert odd in reply.body
    metrics = (await fetch(http, "GET", sidecar.url + "/-/metrics")).body.decode()
    assert "mcc_token_mode_uncut_events_total 1.0" in metrics
    assert "could not cut 1 event(s)" in caplog.text
