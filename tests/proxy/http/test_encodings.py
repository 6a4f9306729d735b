"""Every Content-Encoding the coding harnesses advertise (Claude Code: ``gzip, deflate, br, zstd``;
Codex CLI: ``zstd, gzip``), request and reply: the client gets the upstream's compressed bytes, the
line is the one the same exchange gives uncompressed, durable when the client has the end at any
split of the compressed bytes, and a decompression bomb is a capture failure with its reason."""

from __future__ import annotations

import orjson
import pytest

from capture import make_decoder

from tests.codecs import COMPRESS, FAST_COMPRESS, zstd
from tests.scripted_upstream import json_script, split_every, sse_script
from tests.transcripts import CHAT_JSON, CHAT_JSON_REQUEST, CHAT_REQUEST, CHAT_STREAM
from tests.wire import assert_raw_until_the_end, assert_same_reply, fetch, rollout_url

CHAT = "/v1/chat/completions"
SPLITS = {"whole": None, "1-byte": 1, "7-byte": 7}
#: What a line says that the encoding must not change (its ids and times aside).
# The raw text is the stream as read until the reply was whole: where each read ends differs (below).
_SAME = ("dialect", "status_code", "error_category", "request", "response", "stream_truncated", "failure")


def _pieces(data: bytes, split: str) -> list[bytes]:
    size = SPLITS[split]
    return [data] if size is None else split_every(data, size)


def _line_view(line: dict) -> dict:
    return {key: line.get(key) for key in _SAME}


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("encoding", list(COMPRESS))
async def test_a_compressed_stream_is_relayed_as_sent_and_captured_as_if_plain(http, upstream, sidecar, store,
                                                                               encoding, split):
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM, split_every(CHAT_STREAM, 40))
    await fetch(http, "POST", rollout_url(sidecar.url, "plain", CHAT), CHAT_REQUEST)
    packed = COMPRESS[encoding](CHAT_STREAM)
    script = sse_script(packed, _pieces(packed, split), ending="hang", hang_for=1.0)
    script.headers.append(("Content-Encoding", encoding))
    upstream.scripts[CHAT] = script
    async with http.post(rollout_url(sidecar.url, "packed", CHAT), data=CHAT_REQUEST) as response:
        received = b""
        while len(received) < len(packed):
            chunk = await response.content.readany()
            assert chunk, "the stream ended early"
            received += chunk
        assert received == packed, "the client gets the compressed bytes as sent"
        (line,) = store.read("packed")  # Durable when the client has the end, the upstream still open.
    (plain,) = store.read("plain")
    assert _line_view(line) == _line_view(plain) and line["error_category"] is None
    for kept in (line, plain):
        assert_raw_until_the_end(kept["response_raw"], CHAT_STREAM)


@pytest.mark.parametrize("encoding", list(COMPRESS))
async def test_a_compressed_json_reply_is_captured_as_if_plain(http, upstream, sidecar, store, encoding):
    packed = COMPRESS[encoding](CHAT_JSON)
    script = json_script(packed)
    script.headers.append(("Content-Encoding", encoding))
    upstream.scripts[CHAT] = script
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_JSON_REQUEST)
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), CHAT_JSON_REQUEST)
    assert_same_reply(direct, proxied)
    (line,) = store.read("r1")
    assert line["response"] == orjson.loads(CHAT_JSON) and line["error_category"] is None


@pytest.mark.parametrize("encoding", ["zstd", "br", "gzip"])
async def test_a_compressed_request_body_is_forwarded_as_sent_and_captured_decoded(http, upstream, sidecar, store,
                                                                                   encoding):
    """Codex CLI compresses its request bodies with zstd toward some backends."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    packed = COMPRESS[encoding](CHAT_JSON_REQUEST)
    await fetch(http, "POST", rollout_url(sidecar.url, "r1", CHAT), packed, {"Content-Encoding": encoding})
    assert upstream.received[-1].body == packed and upstream.received[-1].header("Content-Encoding") == encoding
    (line,) = store.read("r1")
    assert line["request"] == orjson.loads(CHAT_JSON_REQUEST) and "request_raw" not in line


@pytest.mark.parametrize("encoding", list(COMPRESS))
def test_a_decompression_bomb_is_refused_at_the_bound_without_allocating_past_it(encoding):
    """64 MiB of zeros (a few KiB compressed): refused once the decoded copy passes the bound,
    having allocated about the bound, never the whole (the sidecar's bound is `MAX_DECODED_BYTES`;
    here 1 MiB, so the test stays quick)."""
    import tracemalloc

    from capture import DecodedTooLarge

    bomb = FAST_COMPRESS[encoding](b"\0" * (64 << 20))
    tracemalloc.start()
    try:
        decode = make_decoder(encoding, limit=1 << 20)
        with pytest.raises(DecodedTooLarge, match="decodes to more than 1,048,576 bytes"):
            for piece in split_every(bomb, 1 << 16):
                decode(piece)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak:,} bytes allocated for a 1 MiB bound"


@pytest.mark.parametrize("encoding", list(COMPRESS))
def test_the_decoders_agree_with_the_codecs_at_every_split(encoding):
    data = CHAT_STREAM * 50
    packed = COMPRESS[encoding](data) + (COMPRESS[encoding](data) if encoding == "zstd" else b"")
    for size in (1, 3, 64, len(packed)):
        decode = make_decoder(encoding)
        assert b"".join(decode(piece) for piece in split_every(packed, size)) == data * (2 if encoding == "zstd" else 1)


def test_an_encoding_nobody_decodes_is_refused_by_name():
    with pytest.raises(ValueError, match="cannot decode Content-Encoding 'compress'"):
        make_decoder("compress")


async def test_an_encoding_nobody_decodes_keeps_its_bytes_base64_and_is_said_and_counted(http, upstream, sidecar, store,
                                                                                        caplog):
    """``compress`` (LZW), which no client advertises any more: forwarded as it came; the line keeps
    the bytes base64 (never read as UTF-8), the log says it (once, then counted), a metric counts it."""
    import base64
    import logging

    packed = b"\x1f\x9d\x90" + bytes(range(256))  # Not UTF-8.
    stream = sse_script(packed, [packed])
    stream.headers.append(("Content-Encoding", "compress"))
    body = json_script(packed)
    body.headers.append(("Content-Encoding", "compress"))
    with caplog.at_level(logging.WARNING, logger="mcc"):
        upstream.scripts[CHAT] = stream
        assert (await fetch(http, "POST", rollout_url(sidecar.url, "s", CHAT), CHAT_REQUEST)).body == packed
        upstream.scripts[CHAT] = body
        assert (await fetch(http, "POST", rollout_url(sidecar.url, "j", CHAT), CHAT_JSON_REQUEST)).body == packed
        await fetch(http, "POST", rollout_url(sidecar.url, "q", CHAT), packed, {"Content-Encoding": "compress"})
    note = "(Content-Encoding 'compress' cannot be decoded: the body's bytes, base64) "
    for rollout in ("s", "j"):
        (line,) = store.read(rollout)
        assert line["response_raw"].startswith(note) and line["error_category"] == "capture_parse_error"
        assert base64.b64decode(line["response_raw"][len(note):]) == packed
    (line,) = store.read("q")
    assert base64.b64decode(line["request_raw"][len(note):]) == packed
    said = [r.getMessage() for r in caplog.records if "cannot decode Content-Encoding 'compress'" in r.getMessage()]
    assert len(said) == 1, said
    metrics = (await fetch(http, "GET", sidecar.url + "/-/metrics")).body.decode()
    assert 'mcc_undecodable_bodies_total{encoding="compress"} 3.0' in metrics


@pytest.mark.parametrize("encoding", ["zstd", "gzip", "br"])
async def test_the_token_mode_decodes_a_compressed_request_adds_its_fields_and_sends_it_plain(
        http, stand_in, start, capture_dir, store, encoding):
    """Codex CLI's zstd request body in the token mode: decoded, the fields added, sent
    identity-encoded; the agent gets the reply its own request would have had, and the call its
    training entry. The stand-in is asked directly with the same request, plain, for the reference."""
    from records import read_token_entries, read_token_records

    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    request = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    direct = await fetch(http, "POST", stand_in.url + CHAT, request, {"Content-Type": "application/json"})
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "z", CHAT), COMPRESS[encoding](request),
                          {"Content-Type": "application/json", "Content-Encoding": encoding})
    assert proxied.status == 200 and _without_ids(proxied.body) == _without_ids(direct.body)
    (line,) = store.read("z")
    assert line["request"] == orjson.loads(request) and line["added_request_fields"]
    (record,) = read_token_records(store, "z")
    assert record.usable and record.source == "token_file" and len(read_token_entries(capture_dir, "z")) == 1


def _without_ids(body: bytes) -> dict:
    reply = orjson.loads(body)
    return {key: value for key, value in reply.items() if key not in ("id", "created")}


async def test_a_refused_decoded_request_is_resent_as_the_agent_sent_it(http, upstream, start, capture_dir, store):
    """The upstream refuses an added field of the decoded, plain request: the agent's own bytes go
    again, compressed as it sent them, with their Content-Encoding."""
    refusal = b'{"error": {"message": "unknown field", "type": "BadRequestError", "param": "logprobs", "code": 400}}'

    def respond(request):
        if request.header("Content-Encoding") is None:
            return json_script(refusal, status=400, reason="Bad Request")
        return json_script(CHAT_JSON)

    upstream.responder = respond
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=True)
    packed = zstd.compress(CHAT_JSON_REQUEST)
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "z", CHAT), packed, {"Content-Encoding": "zstd"})
    assert reply.status == 200 and reply.body == CHAT_JSON
    first, again = upstream.received[-2:]
    assert first.header("Content-Encoding") is None and b'"logprobs":true' in first.body
    assert again.header("Content-Encoding") == "zstd" and again.body == packed
