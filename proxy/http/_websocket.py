"""WebSocket framing (RFC 6455) and permessage-deflate (RFC 7692), sans-io: bytes in, frames and
messages out, frames out as bytes. The relay reads copies of what it forwards unchanged; the bridge
reads a client's frames and writes its own.

`FrameReader` parses one direction of a connection incrementally, at any split of the bytes, and
says where each message's last frame began in the stream (the relay holds a terminal event back
from there until its line is durable: docs/wire.md). Every size is bounded: a frame or message over
``max_message_bytes`` is a protocol error (close code 1009), never an allocation.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import zlib
from typing import NamedTuple, Optional

#: RFC 6455 §1.3: the key's accept value is SHA-1 of the key and this GUID, base64.
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_DATA_OPCODES = (CONTINUATION, TEXT, BINARY)
_CONTROL_OPCODES = (CLOSE, PING, PONG)

#: A Responses event can carry a whole response (``response.completed``): as large as an SSE event.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024

#: Close codes (RFC 6455 §7.4.1).
NORMAL_CLOSURE, GOING_AWAY, PROTOCOL_ERROR, INVALID_PAYLOAD, MESSAGE_TOO_BIG = 1000, 1001, 1002, 1007, 1009


def accept_value(key: bytes) -> bytes:
    """The ``Sec-WebSocket-Accept`` answering ``Sec-WebSocket-Key: key``."""
    return base64.b64encode(hashlib.sha1(key.strip() + _GUID).digest())


class WebSocketError(Exception):
    """The peer broke the protocol: close with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class Message(NamedTuple):
    """One whole message (a data message's fragments joined and inflated), or a control frame.

    ``last_frame_at``: where, in the bytes this reader was fed, the frame that completed it began.
    """

    opcode: int
    payload: bytes
    last_frame_at: int


def encode_frame(opcode: int, payload: bytes, mask: Optional[bytes] = None, fin: bool = True) -> bytes:
    """One frame; a client's frames are masked (``mask``: 4 bytes), a server's never."""
    first = (0x80 if fin else 0) | opcode
    length = len(payload)
    mask_bit = 0x80 if mask is not None else 0
    if length < 126:
        head = struct.pack("!BB", first, mask_bit | length)
    elif length < 1 << 16:
        head = struct.pack("!BBH", first, mask_bit | 126, length)
    else:
        head = struct.pack("!BBQ", first, mask_bit | 127, length)
    if mask is None:
        return head + payload
    return head + mask + _unmask(payload, mask)


def close_payload(code: int, reason: str = "") -> bytes:
    return struct.pack("!H", code) + reason.encode("utf-8")[:123]


def close_code(payload: bytes) -> Optional[int]:
    return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None


def _unmask(payload: bytes, mask: bytes) -> bytes:
    """XOR with the repeated mask, at C speed (one big-int XOR rather than a Python loop)."""
    if not payload:
        return payload
    length = len(payload)
    repeated = (mask * (length // 4 + 1))[:length]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(repeated, "little")).to_bytes(length, "little")


class Deflate(NamedTuple):
    """What permessage-deflate was agreed to be, for the direction a reader reads."""

    no_context_takeover: bool
    window_bits: int


def agreed_deflate(extensions: Optional[bytes], from_server: bool) -> Optional[Deflate]:
    """permessage-deflate as a server's ``Sec-WebSocket-Extensions`` answer agreed it, for the
    messages the server sends (``from_server``) or the client sends; None when not agreed."""
    if not extensions:
        return None
    for offer in extensions.decode("latin-1").split(","):
        name, *params = [part.strip() for part in offer.split(";")]
        if name.lower() != "permessage-deflate":
            continue
        side = "server" if from_server else "client"
        takeover, bits = False, 15
        for param in params:
            key, _, value = param.partition("=")
            key = key.strip().lower()
            if key == f"{side}_no_context_takeover":
                takeover = True
            elif key == f"{side}_max_window_bits" and value.strip().strip('"').isdigit():
                bits = int(value.strip().strip('"'))
        return Deflate(takeover, max(9, min(15, bits)))
    return None


class FrameReader:
    """One direction's frames and messages (``masked``: the client's, which RFC 6455 requires be
    masked). Feed any split of the bytes; each call returns the messages completed so far."""

    def __init__(self, masked: bool, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 deflate: Optional[Deflate] = None) -> None:
        self._masked = masked
        self._max = max_message_bytes
        self._deflate = deflate
        self._inflater = zlib.decompressobj(-deflate.window_bits) if deflate is not None else None
        self._buffer = bytearray()
        #: Stream offset of ``_buffer[0]``.
        self._base = 0
        self._fragments: list[bytes] = []
        self._fragment_bytes = 0
        self._message_opcode: Optional[int] = None
        self._compressed = False

    @property
    def between_messages(self) -> bool:
        """No frame or fragmented message is part-way: a frame of the reader's side may go now."""
        return not self._buffer and self._message_opcode is None

    def feed(self, data: bytes) -> list[Message]:
        self._buffer += data
        messages: list[Message] = []
        while True:
            frame = self._next_frame()
            if frame is None:
                return messages
            message = self._take(*frame)
            if message is not None:
                messages.append(message)

    def _next_frame(self) -> Optional[tuple[int, int, bool, bytes, int]]:
        buffer = self._buffer
        if len(buffer) < 2:
            return None
        first, second = buffer[0], buffer[1]
        fin, rsv, opcode = bool(first & 0x80), first & 0x70, first & 0x0F
        masked, length = bool(second & 0x80), second & 0x7F
        at = 2
        if length == 126:
            if len(buffer) < 4:
                return None
            length, at = struct.unpack_from("!H", buffer, 2)[0], 4
        elif length == 127:
            if len(buffer) < 10:
                return None
            length, at = struct.unpack_from("!Q", buffer, 2)[0], 10
        if opcode not in _DATA_OPCODES and opcode not in _CONTROL_OPCODES:
            raise WebSocketError(PROTOCOL_ERROR, f"unknown opcode {opcode:#x}")
        if opcode in _CONTROL_OPCODES and (length > 125 or not fin):
            raise WebSocketError(PROTOCOL_ERROR, "a control frame must be whole and at most 125 bytes")
        if masked != self._masked:
            raise WebSocketError(PROTOCOL_ERROR, "client frames must be masked, server frames must not be")
        if rsv & 0x30 or (rsv & 0x40 and (self._deflate is None or opcode not in (TEXT, BINARY))):
            raise WebSocketError(PROTOCOL_ERROR, "reserved bits set without an extension that defines them")
        if length > self._max or self._fragment_bytes + length > self._max:
            raise WebSocketError(MESSAGE_TOO_BIG, f"a message over {self._max} bytes")
        mask_at = at
        if masked:
            at += 4
        if len(buffer) < at + length:
            return None
        payload = bytes(buffer[at:at + length])
        if masked:
            payload = _unmask(payload, bytes(buffer[mask_at:mask_at + 4]))
        start = self._base
        del buffer[:at + length]
        self._base += at + length
        return opcode, rsv, fin, payload, start

    def _take(self, opcode: int, rsv: int, fin: bool, payload: bytes, start: int) -> Optional[Message]:
        if opcode in _CONTROL_OPCODES:
            return Message(opcode, payload, start)  # May come between a message's fragments.
        if opcode == CONTINUATION:
            if self._message_opcode is None:
                raise WebSocketError(PROTOCOL_ERROR, "a continuation frame with no message begun")
        else:
            if self._message_opcode is not None:
                raise WebSocketError(PROTOCOL_ERROR, "a new message began before the last one ended")
            self._message_opcode, self._compressed = opcode, bool(rsv & 0x40)
        self._fragments.append(payload)
        self._fragment_bytes += len(payload)
        if not fin:
            return None
        opcode, data = self._message_opcode, b"".join(self._fragments)
        self._fragments, self._fragment_bytes, self._message_opcode = [], 0, None
        if self._compressed:
            data = self._inflate(data)
        if opcode == TEXT:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                raise WebSocketError(INVALID_PAYLOAD, "a text message that is not UTF-8") from None
        return Message(opcode, data, start)

    def _inflate(self, data: bytes) -> bytes:
        """RFC 7692 §7.2.2: the message's deflate data, its tail ``00 00 ff ff`` restored; bounded."""
        inflater = self._inflater
        assert inflater is not None and self._deflate is not None
        try:
            out = inflater.decompress(data + b"\x00\x00\xff\xff", self._max + 1)
        except zlib.error as exc:
            raise WebSocketError(INVALID_PAYLOAD, f"a compressed message that does not inflate: {exc}") from None
        if len(out) > self._max or inflater.unconsumed_tail:
            raise WebSocketError(MESSAGE_TOO_BIG, f"a message over {self._max} bytes once inflated")
        if self._deflate.no_context_takeover:
            self._inflater = zlib.decompressobj(-self._deflate.window_bits)
        return out


__all__ = [
    "BINARY", "CLOSE", "CONTINUATION", "DEFAULT_MAX_MESSAGE_BYTES", "Deflate", "FrameReader", "GOING_AWAY",
    "INVALID_PAYLOAD", "MESSAGE_TOO_BIG", "Message", "NORMAL_CLOSURE", "PING", "PONG",
    "PROTOCOL_ERROR", "TEXT", "WebSocketError", "accept_value", "agreed_deflate",
    "close_code", "close_payload", "encode_frame",
]
