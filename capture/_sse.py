"""An incremental, sans-io Server-Sent Events parser.

Follows the WHATWG HTML "event stream interpretation" rules
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):

* lines end with CRLF, LF or CR, and a line end may be split across chunks (a CR at the end of
  one chunk and an LF at the start of the next are one line end);
* lines are split as bytes and decoded as UTF-8 only when whole, so a multi-byte sequence split
  across chunks decodes correctly (the approach of openai-python's SSE decoder);
* ``:`` starts a comment; ``field: value`` loses one leading space; ``data`` lines join with LF;
* a blank line dispatches the event, unless its data buffer is empty;
* an event still unterminated at end of stream is not dispatched.

One event's size is bounded: an event larger than ``max_event_bytes`` is dropped and counted in
`SSEParser.oversized_events` instead of being held in memory forever.

The parser sits on the proxy's per-chunk path, so `feed` is written for speed: data lines stay
bytes until their event is dispatched and are decoded once, and the common ``data: ...`` line
takes a short path.

`feed_blocks` frames the same stream by the same rules but keeps every byte: each block (the
bytes from the end of one blank line to the end of the next) comes out whole, with what it
dispatched and where each data value stands in it. The token capture mode cuts those spans
(docs/tokens.md), so the capture and the cut read one stream through one reader: whatever framing
the upstream uses (CR, LF, CRLF, ``\n\r\n``, comments, a BOM), both see the same events. Its
cost is linear in the bytes at any read size: a block's bytes are gathered once, and a line is
looked at once, when it is whole.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from . import _native

#: Large enough for a whole Responses `response.completed` payload with a long output.
DEFAULT_MAX_EVENT_BYTES = 64 * 1024 * 1024

_BOM = b"\xef\xbb\xbf"


class ServerSentEvent(NamedTuple):
    """One dispatched event. ``event`` is ``"message"`` when the stream named none."""

    event: str = "message"
    data: str = ""
    id: str = ""
    retry: int | None = None


class EventBlock(NamedTuple):
    """One block of a stream as it came (`SSEParser.feed_blocks`).

    ``raw`` is every byte from the end of the previous block to the end of this one's blank
    line (a comment, an ``id`` line, a stray LF of a CRLF split across reads all stay in it);
    ``data`` is what the block dispatched, as bytes (None: nothing, e.g. a comment-only block or
    an event past ``max_event_bytes``); ``data_spans`` are the [start, end) of each data line's
    value in ``raw``, in order, so ``data == b"\\n".join(raw[s:e] for s, e in data_spans)``.
    ``ends_previous``: ``raw`` is the LF of a CRLF whose CR ended the previous block in an earlier
    read (that block went out without waiting for it): it belongs to that block.
    """

    raw: bytes
    event_type: str
    data: bytes | None
    data_spans: tuple[tuple[int, int], ...]
    ends_previous: bool = False


class SSEParser:
    """Feed bytes in, get whole events out. ``feed(b"")`` is a no-op; call `close` at the end."""

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max_event_bytes = max_event_bytes
        self._partial_line: list[bytes] = []
        self._partial_size = 0
        self._skip_leading_lf = False
        self._at_stream_start = True
        self._event_type = ""
        self._data_lines: list[bytes] = []
        self._event_size = 0
        self._last_event_id = ""
        self._retry: int | None = None
        self._discarding = False
        self._dropping_line = False
        #: True while a line needs the slow path: the stream's first line (BOM), a line whose
        #: start arrived in an earlier chunk, or the rest of a line dropped as oversized.
        self._irregular = True
        #: Number of field lines (not comments, not blank lines) seen so far.
        self.field_lines = 0
        #: Events dropped because they grew past ``max_event_bytes``.
        self.oversized_events = 0
        #: `feed_blocks`: the current block's bytes so far, where its unfinished line starts,
        #: and the spans of its data values.
        self._block = bytearray()
        self._line_start = 0
        self._data_spans: list[tuple[int, int]] = []

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Parse ``chunk`` and return the events it completed, in order."""
        if self._skip_leading_lf:
            self._skip_leading_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if not chunk:
            return []
        pieces = chunk.splitlines(keepends=True)
        tail = None
        if pieces[-1][-1] not in (10, 13):  # 10 is LF, 13 is CR: the last line is not yet whole.
            tail = pieces.pop()
        elif chunk[-1] == 13:  # An LF starting the next chunk ends the same line (CRLF split).
            self._skip_leading_lf = True
        events: list[ServerSentEvent] = []
        data_lines = self._data_lines
        for piece in pieces:
            if self._irregular:
                completed = self._complete_line(piece)
                if completed is None:
                    continue
                piece = completed
            line = piece.rstrip(b"\r\n")
            if not line:
                if data_lines and not self._discarding:
                    events.append(ServerSentEvent(self._event_type or "message", b"\n".join(data_lines).decode("utf-8", "replace"),
                                                  self._last_event_id, self._retry))
                    data_lines.clear()
                    self._event_size = 0
                    self._event_type = ""
                else:
                    self._dispatch_nothing()
            elif self._discarding or line[0] == 58:  # 58 is ":": a comment.
                continue
            elif line[:6] == b"data: ":
                self.field_lines += 1
                self._event_size += len(line)
                if self._event_size > self._max_event_bytes:
                    self._start_discarding()
                else:
                    data_lines.append(line[6:])
            else:
                self._other_field(line)
        if tail is not None:
            self._extend_partial_line(tail)
        return events

    def feed_plain(self, chunk: bytes) -> list[tuple[str, bytes, bytes]] | None:
        """The events of ``chunk`` as (type, data, lines), when it is nothing but whole events of the
        plain shape servers write -- ``data: VALUE`` or ``event: NAME`` + ``data: VALUE``, each
        line ending in LF, each event in a blank line -- and the parser is between events.
        Otherwise None, with nothing consumed: the chunk then goes to `feed`.

        The same events `feed` would dispatch, with the same effect on the parser, for a
        fraction of the work: the data stays bytes (the JSON parser takes them as they are) and
        no line is looked at twice. One event per chunk is how vLLM, OpenAI and Anthropic stream.
        """
        if self._irregular and not self._plain_stream_start(chunk):
            return None
        if self._skip_leading_lf or self._data_lines or self._event_type or self._discarding or self._block:
            return None
        core = _native.core
        read = (core.plain_events if core is not None else plain_events)(chunk, self._max_event_bytes)
        if read is None:
            return None
        events, field_lines = read
        self.field_lines += field_lines
        self._irregular = self._at_stream_start = False
        return events

    def takes_plain(self, chunk: bytes) -> bool:
        """`feed_plain` could take ``chunk`` whole (whole events, LF line ends, between events), so
        a caller that frames its plain events itself (the tap's templates) may, with `took_plain`."""
        return not ((self._irregular and not self._plain_stream_start(chunk)) or self._skip_leading_lf or self._data_lines
                    or self._event_type or self._discarding or self._block or chunk[-2:] != b"\n\n" or b"\r" in chunk)

    def took_plain(self, field_lines: int) -> None:
        """Plain events framed by the caller (`takes_plain`): their ``field_lines`` counted."""
        self.field_lines += field_lines

    def feed_blocks(self, chunk: bytes) -> list[EventBlock]:
        """Frame ``chunk``: the blocks it completed, every byte of them as it came (`EventBlock`).

        The same lines, events and counters as `feed`; use one or the other for a stream (with
        `feed_plain` beside either). Bytes of an unfinished block wait in the parser (`close_blocks`).
        """
        block = self._block
        blocks: list[EventBlock] = []
        if self._skip_leading_lf:  # The LF of a CRLF whose CR ended the last read: kept, not a line.
            self._skip_leading_lf = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
                if block:
                    block += b"\n"
                    self._line_start = len(block)
                else:  # It ends the block already framed: its own piece, never part of the next.
                    blocks.append(EventBlock(b"\n", "message", None, (), ends_previous=True))
        if not chunk:
            return blocks
        for piece in chunk.splitlines(keepends=True):
            block += piece
            last = piece[-1]
            if last != 10 and last != 13:  # An unfinished line: the chunk's last piece.
                self._irregular = True
                break
            line_end = len(block) - (2 if last == 10 and piece[-2:] == b"\r\n" else 1)
            ended = self._block_line(bytes(block[self._line_start:line_end]), self._line_start)
            if ended is not None:
                blocks.append(ended)
            self._line_start = len(block)
        else:
            self._irregular = False
            if chunk[-1] == 13:  # An LF starting the next read ends the same line.
                self._skip_leading_lf = True
        return blocks

    def close_blocks(self) -> EventBlock | None:
        """End of stream for `feed_blocks`: the unfinished block's bytes, with the data it would
        have dispatched had it ended (WHATWG drops it: for the capture it is not an event, but
        its bytes still reach the client and the cut must see them)."""
        block = self._block
        if not block:
            self._reset_blocks()
            return None
        if self._line_start < len(block):
            self._block_line(bytes(block[self._line_start:]), self._line_start, final=True)
        raw = bytes(block)
        unfinished = self._block_event(raw)
        self._reset_blocks()
        return unfinished

    def _block_line(self, line: bytes, start: int, final: bool = False) -> EventBlock | None:
        """One whole line of a block at ``start`` in it; the block when the line is blank."""
        if self._at_stream_start:
            self._at_stream_start = False
            if line.startswith(_BOM):  # One leading BOM is ignored (WHATWG).
                line, start = line[3:], start + 3
        if not line:
            if final:
                return None
            raw = bytes(self._block)
            ended = self._block_event(raw)
            self._block.clear()
            self._data_spans = []
            self._dispatch_nothing()
            return ended
        if self._discarding or line[0] == 58:  # 58 is ":": a comment.
            return None
        colon = line.find(b":")
        name = line if colon < 0 else line[:colon]
        if name != b"data":
            self._other_field(line)
            return None
        self.field_lines += 1
        value_start = len(line) if colon < 0 else colon + 1 + (line[colon + 1:colon + 2] == b" ")
        self._event_size += len(line) - value_start + 1
        if self._event_size > self._max_event_bytes:
            self._start_discarding()
            self._data_spans = []
        else:
            self._data_spans.append((start + value_start, start + len(line)))
        return None

    def _block_event(self, raw: bytes) -> EventBlock:
        spans = tuple(self._data_spans)
        data = None
        if spans and not self._discarding:
            data = raw[spans[0][0]:spans[0][1]] if len(spans) == 1 else b"\n".join(raw[a:b] for a, b in spans)
        return EventBlock(raw, self._event_type or "message", data, spans)

    def between_events(self) -> bool:
        """Nothing of an event is buffered: the next byte starts a line of a new event."""
        return not (self._partial_line or self._skip_leading_lf or self._data_lines or self._event_type
                    or self._discarding or self._block or self._dropping_line)

    def _reset_blocks(self) -> None:
        self._block = bytearray()
        self._line_start = 0
        self._data_spans = []
        self._skip_leading_lf = False
        self._discarding = False
        self._reset_event()

    def _plain_stream_start(self, chunk: bytes) -> bool:
        """The stream's first chunk, whole lines, no BOM (not even its first byte): `feed` would
        do nothing irregular with it. The first chunk is what TTFT waits for."""
        return self._at_stream_start and not self._partial_line and chunk[:1] != _BOM[:1]

    def close(self) -> list[ServerSentEvent]:
        """End of stream: an unterminated event is discarded, as the WHATWG rules require."""
        self._partial_line.clear()
        self._partial_size = 0
        self._reset_event()
        return []

    @property
    def last_event_id(self) -> str:
        return self._last_event_id

    @property
    def retry(self) -> int | None:
        return self._retry

    def _complete_line(self, piece: bytes) -> bytes | None:
        """Join a line's earlier pieces, drop the rest of an oversized line, strip a first BOM."""
        self._irregular = False
        if self._dropping_line:  # The end of a line whose start was dropped as oversized.
            self._dropping_line = False
            return None
        if self._partial_line:
            self._partial_line.append(piece)
            piece = b"".join(self._partial_line)
            self._partial_line.clear()
            self._partial_size = 0
        if self._at_stream_start:
            self._at_stream_start = False
            if piece.startswith(_BOM):  # One leading BOM is ignored (WHATWG).
                piece = piece[3:]
        return piece

    def _add_data(self, value: bytes) -> None:
        self._event_size += len(value) + 1
        if self._event_size > self._max_event_bytes:
            self._start_discarding()
        else:
            self._data_lines.append(value)

    def _other_field(self, line: bytes) -> None:
        self.field_lines += 1
        name, colon, value = line.decode("utf-8", "replace").partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":  # `data:` without a space, or `data` alone.
            self._add_data(value.encode())
        elif name == "event":
            self._event_type = value
        elif name == "id":
            if "\x00" not in value:
                self._last_event_id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry = int(value)

    def _extend_partial_line(self, piece: bytes) -> None:
        self._irregular = True
        self._partial_size += len(piece)
        if self._discarding or self._event_size + self._partial_size > self._max_event_bytes:
            self._start_discarding()
            self._dropping_line = True
            return
        self._partial_line.append(piece)

    def _dispatch_nothing(self) -> None:
        """A blank line with no data (or ending a dropped event) dispatches nothing (WHATWG)."""
        self._discarding = False
        self._reset_event()

    def _start_discarding(self) -> None:
        if not self._discarding:
            self.oversized_events += 1
        self._discarding = True
        self._partial_line.clear()
        self._partial_size = 0
        self._data_lines.clear()
        self._event_size = 0

    def _reset_event(self) -> None:
        self._event_type = ""
        self._data_lines.clear()
        self._event_size = 0


def plain_events(chunk: bytes, max_event_bytes: int) -> Optional[tuple[list[tuple[str, bytes, bytes]], int]]:
    """`SSEParser.feed_plain`'s reading of ``chunk``: its events as (type, data, lines) and the
    field lines they hold, when it is whole events of the plain shape and nothing else (each line
    ending in LF, no CR anywhere, the last event's blank line at its end); else None.

    The reference of the compiled core's ``plain_events`` (capture/_core.c, `capture._native`)."""
    if chunk[-2:] != b"\n\n" or b"\r" in chunk:
        return None
    events = []
    field_lines = 0
    for part in chunk[:-2].split(b"\n\n"):
        if part[:6] == b"data: ":
            if b"\n" in part:
                return None  # Several data lines, or another field after this one.
            kind, data = "message", part[6:]
            field_lines += 1
        elif part[:7] == b"event: ":
            name, _, data_line = part.partition(b"\n")
            if data_line[:6] != b"data: " or b"\n" in data_line:
                return None
            kind, data = name[7:].decode("utf-8", "replace") or "message", data_line[6:]
            field_lines += 2
        else:
            return None  # A comment, an id or retry field, a blank line, ...
        if len(data) + 6 > max_event_bytes:
            return None  # `feed` drops and counts it.
        events.append((kind, data, part))
    return events, field_lines
