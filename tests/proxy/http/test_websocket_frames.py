"""RFC 6455 framing and RFC 7692 permessage-deflate, sans-io (`proxy.http.websocket`): every case
whole, byte by byte and at random splits, against frames built here by hand (struct, zlib), not by
the code under test."""

from __future__ import annotations

import random
import struct
import zlib

import pytest

from proxy.http import websocket


def frame(opcode: int, payload: bytes, fin: bool = True, mask: bytes | None = None, rsv1: bool = False) -> bytes:
    """A frame by the RFC's layout (section 5.2), written independently of `encode_frame`."""
    first = (0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode
    length = len(payload)
    if length < 126:
        head = bytes([first, (0x80 if mask else 0) | length])
    elif length < 65536:
        head = bytes([first, (0x80 if mask else 0) | 126]) + struct.pack(">H", length)
    else:
        head = bytes([first, (0x80 if mask else 0) | 127]) + struct.pack(">Q", length)
    if mask is None:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def deflated(message: bytes, compressor) -> bytes:
    data = compressor.compress(message) + compressor.flush(zlib.Z_SYNC_FLUSH)
    assert data.endswith(b"\x00\x00\xff\xff")
    return data[:-4]


def case(masked: bool, deflate: bool) -> tuple[bytes, list[tuple[int, bytes, int]]]:
    """A stream of frames and the messages it holds, each with where its last frame begins."""
    mask = b"\x9a\x12\x00\xff" if masked else None
    compressor = zlib.compressobj(wbits=-15)
    stream, expected = b"", []
    texts = [b'{"type":"response.created"}', "é→中".encode() * 50, b"x" * 70_000, b'{"type":"response.completed"}']
    for number, text in enumerate(texts):
        body = deflated(text, compressor) if deflate else text
        if number == 1:  # Fragmented, with a ping between its fragments.
            pieces = [body[:5], body[5:40], body[40:]]
            stream += frame(websocket.TEXT, pieces[0], fin=False, mask=mask, rsv1=deflate)
            stream += frame(websocket.CONTINUATION, pieces[1], fin=False, mask=mask)
            ping_at = len(stream)
            stream += frame(websocket.PING, b"p", mask=mask)
            expected.append((websocket.PING, b"p", ping_at))
            last_at = len(stream)
            stream += frame(websocket.CONTINUATION, pieces[2], mask=mask)
        else:
            last_at = len(stream)
            stream += frame(websocket.TEXT, body, mask=mask, rsv1=deflate)
        expected.append((websocket.TEXT, text, last_at))
    last_at = len(stream)
    stream += frame(websocket.CLOSE, struct.pack(">H", 1000), mask=mask)
    expected.append((websocket.CLOSE, struct.pack(">H", 1000), last_at))
    return stream, expected


def splits(data: bytes, rng: random.Random) -> list[list[bytes]]:
    cuts = sorted(rng.sample(range(1, len(data)), 12))
    return [[data], [data[i:i + 1] for i in range(len(data))] if len(data) < 5000 else [data[:1], data[1:]],
            [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]]


@pytest.mark.parametrize("masked", [True, False], ids=["client", "server"])
@pytest.mark.parametrize("deflate", [False, True], ids=["plain", "deflate"])
def test_messages_at_every_split(masked, deflate):
    stream, expected = case(masked, deflate)
    rng = random.Random(7)
    agreed = websocket.Deflate(False, 15) if deflate else None
    for pieces in splits(stream, rng) + [[stream[i:i + 1] for i in range(len(stream))]]:
        reader = websocket.FrameReader(masked=masked, deflate=agreed)
        got = [message for piece in pieces for message in reader.feed(piece)]
        assert [(m.opcode, m.payload, m.last_frame_at) for m in got] == expected


@pytest.mark.parametrize("bad, code", [
    (frame(websocket.TEXT, b"hi"), websocket.PROTOCOL_ERROR),  # A client frame unmasked.
    (frame(0x3, b"", mask=b"abcd"), websocket.PROTOCOL_ERROR),  # A reserved opcode.
    (frame(websocket.PING, b"x" * 126, mask=b"abcd"), websocket.PROTOCOL_ERROR),  # A control frame too long.
    (frame(websocket.PING, b"x", fin=False, mask=b"abcd"), websocket.PROTOCOL_ERROR),  # A control frame fragmented.
    (frame(websocket.CONTINUATION, b"x", mask=b"abcd"), websocket.PROTOCOL_ERROR),  # Nothing to continue.
    (frame(websocket.TEXT, b"x", fin=False, mask=b"abcd") + frame(websocket.TEXT, b"y", mask=b"abcd"),
     websocket.PROTOCOL_ERROR),  # A new message inside one.
    (frame(websocket.TEXT, b"x", mask=b"abcd", rsv1=True), websocket.PROTOCOL_ERROR),  # RSV1, nothing agreed.
    (frame(websocket.TEXT, b"\xff\xfe", mask=b"abcd"), websocket.INVALID_PAYLOAD),  # Not UTF-8.
    (bytes([0x81, 0xFF]) + struct.pack(">Q", 1 << 40), websocket.MESSAGE_TOO_BIG),  # A 1 TB frame's head.
    (frame(websocket.TEXT, b"a" * 600, fin=False, mask=b"abcd") + frame(websocket.CONTINUATION, b"a" * 600,
                                                                        mask=b"abcd"), websocket.MESSAGE_TOO_BIG),
])
def test_protocol_errors_have_their_close_codes(bad, code):
    """Refused from the head: a frame over the bound is never buffered."""
    reader = websocket.FrameReader(masked=True, max_message_bytes=1024)
    with pytest.raises(websocket.WebSocketError) as raised:
        reader.feed(bad)
    assert raised.value.code == code


def test_a_deflate_bomb_is_refused_within_the_bound():
    compressor = zlib.compressobj(wbits=-15)
    bomb = deflated(b"\0" * (64 * 1024 * 1024), compressor)
    reader = websocket.FrameReader(masked=False, max_message_bytes=1024 * 1024, deflate=websocket.Deflate(False, 15))
    with pytest.raises(websocket.WebSocketError) as raised:
        reader.feed(frame(websocket.TEXT, bomb, rsv1=True))
    assert raised.value.code == websocket.MESSAGE_TOO_BIG


def test_no_context_takeover_and_the_handshake_values():
    compressor = zlib.compressobj(wbits=-15)
    first = deflated(b"hello hello", compressor)
    fresh = zlib.compressobj(wbits=-15)
    second = deflated(b"hello hello", fresh)  # Each message from a fresh compressor.
    agreed = websocket.agreed_deflate(b"permessage-deflate; server_no_context_takeover", from_server=True)
    assert agreed == websocket.Deflate(True, 15)
    reader = websocket.FrameReader(masked=False, deflate=agreed)
    got = reader.feed(frame(websocket.TEXT, first, rsv1=True) + frame(websocket.TEXT, second, rsv1=True))
    assert [m.payload for m in got] == [b"hello hello"] * 2
    assert websocket.agreed_deflate(b"x-other", from_server=True) is None
    assert websocket.agreed_deflate(b"permessage-deflate; client_max_window_bits=10", from_server=False).window_bits == 10
    # RFC 6455 section 1.3's own example.
    assert websocket.accept_value(b"dGhlIHNhbXBsZSBub25jZQ==") == b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    assert websocket.encode_frame(websocket.TEXT, b"x" * 70_000, mask=b"abcd") == frame(websocket.TEXT, b"x" * 70_000,
                                                                                       mask=b"abcd")
