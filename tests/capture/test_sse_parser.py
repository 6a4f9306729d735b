"""The incremental SSE parser (WHATWG event-stream rules), every case whole, byte by byte and at random splits."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capture import ServerSentEvent, SSEParser


def parse_in_pieces(data: bytes, pieces: list[bytes] | None = None, **kwargs) -> tuple[list[ServerSentEvent], SSEParser]:
    parser = SSEParser(**kwargs)
    events = []
    for piece in pieces if pieces is not None else [data]:
        events += parser.feed(piece)
    events += parser.close()
    return events, parser


def chunkings(data: bytes, seed: int = 0) -> list[list[bytes]]:
    """Whole, one byte at a time, and three seeded random splittings."""
    rng = random.Random(seed)
    result = [[data], [data[i:i + 1] for i in range(len(data))]]
    for _ in range(3):
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 12)))) if len(data) > 1 else []
        result.append([data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])])
    return result


CASES = {
    "lf": (b"data: a\n\ndata: b\n\n", [ServerSentEvent(data="a"), ServerSentEvent(data="b")]),
    "crlf": (b"data: a\r\n\r\ndata: b\r\n\r\n", [ServerSentEvent(data="a"), ServerSentEvent(data="b")]),
    "cr": (b"data: a\r\rdata: b\r\r", [ServerSentEvent(data="a"), ServerSentEvent(data="b")]),
    "mixed line ends": (b"event: x\rdata: 1\r\ndata: 2\n\r\n", [ServerSentEvent(event="x", data="1\n2")]),
    "comment": (b": keep-alive\n\n:another\ndata: z\n\n", [ServerSentEvent(data="z")]),
    "no space after colon": (b"data:tight\n\n", [ServerSentEvent(data="tight")]),
    "two spaces keep one": (b"data:  two\n\n", [ServerSentEvent(data=" two")]),
    "field without colon": (b"data\n\n", [ServerSentEvent(data="")]),
    "id and retry": (b"id: 7\nretry: 1500\ndata: x\n\n", [ServerSentEvent(data="x", id="7", retry=1500)]),
    "bad retry ignored": (b"retry: soon\ndata: x\n\n", [ServerSentEvent(data="x")]),
    "id with NUL ignored": (b"id: a\x00b\ndata: x\n\n", [ServerSentEvent(data="x")]),
    "unknown field ignored": (b"foo: bar\ndata: x\n\n", [ServerSentEvent(data="x")]),
    "event without data not dispatched": (b"event: ping\n\ndata: y\n\n", [ServerSentEvent(data="y")]),
    "unterminated event dropped": (b"data: done\n\ndata: partial", [ServerSentEvent(data="done")]),
    "leading BOM": (b"\xef\xbb\xbfdata: bom\n\n", [ServerSentEvent(data="bom")]),
    "utf8 multibyte": ("data: caf\u00e9 \u2603 \U0001F600\n\n".encode(), [ServerSentEvent(data="caf\u00e9 \u2603 \U0001F600")]),
    "event name resets": (b"event: a\ndata: 1\n\ndata: 2\n\n", [ServerSentEvent(event="a", data="1"), ServerSentEvent(data="2")]),
    "done marker": (b"data: [DONE]\n\n", [ServerSentEvent(data="[DONE]")]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_gives_the_same_events_at_every_chunking(name):
    data, expected = CASES[name]
    for pieces in chunkings(data, seed=len(name)):
        events, _ = parse_in_pieces(data, pieces)
        assert events == expected, f"chunking {[len(p) for p in pieces]}"


def test_cr_at_chunk_end_and_lf_at_next_start_is_one_line_end():
    """'data: a\\r' + '\\n\\n' must not produce an extra blank line (which would dispatch early)."""
    events, _ = parse_in_pieces(b"", [b"data: a\r", b"\ndata: b\r", b"\n\r\n"])
    assert events == [ServerSentEvent(data="a\nb")]


def test_oversized_event_is_dropped_and_counted_and_parsing_recovers():
    big = b"data: " + b"x" * 5000 + b"\ndata: more\n\n"
    data = b"data: small\n\n" + big + b"data: after\n\n"
    for pieces in chunkings(data, seed=3):
        events, parser = parse_in_pieces(data, pieces, max_event_bytes=1000)
        assert events == [ServerSentEvent(data="small"), ServerSentEvent(data="after")]
        assert parser.oversized_events == 1


def test_field_lines_count_ignores_comments():
    parser = SSEParser()
    parser.feed(b": comment\n\n")
    assert parser.field_lines == 0
    parser.feed(b"data: x\n")
    assert parser.field_lines == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["data", "event", "id", ": c"]), st.text(alphabet=st.characters(blacklist_characters="\r\n\x00", blacklist_categories=("Cs",)), max_size=20)), max_size=20),
       st.sampled_from([b"\n", b"\r\n", b"\r"]), st.randoms(use_true_random=False))
def test_any_stream_parses_the_same_however_it_is_split(fields, line_end, rng):
    """Property: for any stream and any split points, the events equal the whole-buffer parse."""
    lines = [(name if name.startswith(":") else f"{name}: {value}").encode() for name, value in fields]
    data = line_end.join(lines) + line_end + line_end
    whole, _ = parse_in_pieces(data)
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, 8))) if len(data) > 1 else []
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    split, _ = parse_in_pieces(data, pieces)
    assert split == whole


# -- feed_plain: the fast path for chunks of whole, plain events ------------------------------

def parse_preferring_plain(pieces: list[bytes], **kwargs) -> tuple[list[ServerSentEvent], SSEParser]:
    """What the tap does: `feed_plain` where it takes the chunk, `feed` otherwise."""
    parser = SSEParser(**kwargs)
    events = []
    for piece in pieces:
        plain = parser.feed_plain(piece)
        if plain is None:
            events += parser.feed(piece)
        else:
            events += [ServerSentEvent(kind, data.decode("utf-8", "replace"), parser.last_event_id, parser.retry)
                       for kind, data, lines in plain]
            assert [lines + b"\n\n" for _, _, lines in plain] == [part + b"\n\n" for part in piece[:-2].split(b"\n\n")]
    events += parser.close()
    return events, parser


def event_per_chunk(data: bytes) -> list[bytes]:
    """Split after every blank line, as vLLM writes its chunks."""
    return [part + b"\n\n" for part in data.split(b"\n\n")[:-1]] + ([data.split(b"\n\n")[-1]] if not data.endswith(b"\n\n") else [])


@pytest.mark.parametrize("name", sorted(CASES))
def test_plain_fast_path_gives_what_feed_gives(name):
    data, expected = CASES[name]
    for pieces in [*chunkings(data, seed=len(name)), event_per_chunk(data), [data, data]]:
        events, parser = parse_preferring_plain(pieces)
        reference, reference_parser = parse_in_pieces(data, pieces)
        assert events == reference and parser.field_lines == reference_parser.field_lines


def test_plain_fast_path_takes_plain_chunks_and_refuses_the_rest():
    with_bom = SSEParser()
    assert with_bom.feed_plain(b"\xef\xbb\xbfdata: 1\n\n") is None  # A first line with a BOM: `feed`.
    assert with_bom.feed(b"\xef\xbb\xbfdata: 1\n\n") == [ServerSentEvent(data="1")]
    parser = SSEParser(max_event_bytes=100)
    assert parser.feed_plain(b"data: 1\n\n") == [("message", b"1", b"data: 1")]  # The first chunk too (TTFT).
    assert parser.feed_plain(b"event: a\ndata: {}\n\ndata: 2\n\n") == [("a", b"{}", b"event: a\ndata: {}"),
                                                                       ("message", b"2", b"data: 2")]
    assert parser.field_lines == 4
    for other in (b"data: 1\r\n\r\n", b"data: 1\ndata: 2\n\n", b": ping\n\n", b"id: 3\ndata: 1\n\n", b"data: 1\n",
                  b"data: 1\n\n\n", b"data:1\n\n", b"data: " + b"x" * 100 + b"\n\n"):
        assert parser.feed_plain(other) is None, other
    assert parser.field_lines == 4  # Nothing was consumed by a refusal.
    parser.feed(b"data: half")
    assert parser.feed_plain(b"data: 1\n\n") is None  # Mid-event: `feed` joins the line first.


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["data", "event", "id", ": c", ""]),
                          st.text(alphabet=st.characters(blacklist_characters="\r\n\x00", blacklist_categories=("Cs",)), max_size=12)),
                max_size=24),
       st.randoms(use_true_random=False))
def test_plain_fast_path_agrees_with_feed_on_any_lf_stream(fields, rng):
    """Property: for any LF stream, split at event ends and at random points, the same events."""
    lines = [(name if name.startswith(":") or not name else f"{name}: {value}").encode() for name, value in fields]
    data = b"\n".join(lines) + b"\n\n"
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, 4))) if len(data) > 1 else []
    for pieces in (event_per_chunk(data), [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]):
        events, parser = parse_preferring_plain(pieces)
        reference, reference_parser = parse_in_pieces(data, pieces)
        assert events == reference and parser.field_lines == reference_parser.field_lines
