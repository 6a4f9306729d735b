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
"""

from __future__ import annotations

from dataclasses import dataclass

#: Large enough for a whole Responses `response.completed` payload with a long output.
DEFAULT_MAX_EVENT_BYTES = 64 * 1024 * 1024

_LINE_ENDS = (b"\n", b"\r")


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched event. ``event`` is ``"message"`` when the stream named none."""

    event: str = "message"
    data: str = ""
    id: str = ""
    retry: int | None = None


class SSEParser:
    """Feed bytes in, get whole events out. ``feed(b"")`` is a no-op; call `close` at the end."""

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max_event_bytes = max_event_bytes
        self._partial_line: list[bytes] = []
        self._partial_size = 0
        self._skip_leading_lf = False
        self._at_stream_start = True
        self._event_type = ""
        self._data_lines: list[str] = []
        self._event_size = 0
        self._last_event_id = ""
        self._retry: int | None = None
        self._discarding = False
        self._dropping_line = False
        #: Number of field lines (not comments, not blank lines) seen so far.
        self.field_lines = 0
        #: Events dropped because they grew past ``max_event_bytes``.
        self.oversized_events = 0

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Parse ``chunk`` and return the events it completed, in order."""
        if self._skip_leading_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_leading_lf = False
        if not chunk:
            return []
        if b"\n" not in chunk and b"\r" not in chunk:
            self._extend_partial_line(chunk)
            return []
        pieces = chunk.splitlines(keepends=True)
        tail = pieces.pop() if not pieces[-1].endswith(_LINE_ENDS) else None
        events: list[ServerSentEvent] = []
        for piece in pieces:
            if self._dropping_line:  # The end of a line whose start was dropped as oversized.
                self._dropping_line = False
                continue
            if self._partial_line:
                self._partial_line.append(piece)
                piece = b"".join(self._partial_line)
                self._partial_line.clear()
                self._partial_size = 0
            self._process_line(piece.rstrip(b"\r\n"), events)
        if tail is not None:
            self._extend_partial_line(tail)
        elif chunk.endswith(b"\r"):
            self._skip_leading_lf = True
        return events

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

    def _extend_partial_line(self, piece: bytes) -> None:
        self._partial_size += len(piece)
        if self._discarding or self._event_size + self._partial_size > self._max_event_bytes:
            self._start_discarding()
            self._dropping_line = True
            return
        self._partial_line.append(piece)

    def _process_line(self, raw: bytes, events: list[ServerSentEvent]) -> None:
        if self._at_stream_start:
            self._at_stream_start = False
            if raw.startswith(b"\xef\xbb\xbf"):  # One leading BOM is ignored (WHATWG).
                raw = raw[3:]
        if not raw:
            self._dispatch(events)
            return
        if self._discarding or raw[:1] == b":":
            return
        self.field_lines += 1
        line = raw.decode("utf-8", "replace")
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        self._apply_field(name, value, len(raw))

    def _apply_field(self, name: str, value: str, size: int) -> None:
        if name == "data":
            self._event_size += size
            if self._event_size > self._max_event_bytes:
                self._start_discarding()
                return
            self._data_lines.append(value)
        elif name == "event":
            self._event_type = value
        elif name == "id":
            if "\x00" not in value:
                self._last_event_id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry = int(value)

    def _dispatch(self, events: list[ServerSentEvent]) -> None:
        if self._discarding:
            self._discarding = False
        elif self._data_lines:
            events.append(
                ServerSentEvent(
                    event=self._event_type or "message",
                    data="\n".join(self._data_lines),
                    id=self._last_event_id,
                    retry=self._retry,
                )
            )
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
