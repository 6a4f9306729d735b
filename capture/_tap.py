"""The tap: a sans-io observer of one reply's body, fed a copy of each chunk as it passes.

`StreamTap` parses an SSE reply as it streams and reports the chunk that completes the terminal
event, so the proxy can hold exactly that chunk until the capture line is durable (docs/wire.md).
`BodyTap` collects a non-streaming body. Both end with `finish`, which says what goes on the
capture line. Neither ever raises into the proxy's pump: a bug becomes ``capture_parse_error``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import orjson

from ._categories import categorize_status
from ._chat import ChatReassembler, CollectedArrays
from ._completions import CompletionsReassembler
from ._decoding import Decoder, as_evidence, decodable, make_decoder
from ._generate import GenerateReassembler
from ._event_templates import LEARN_AFTER_LINES, LEARN_FROM_READ_BYTES, EventTemplate
from ._messages import MessagesReassembler
from ._reassembler import Reassembler
from ._responses import ResponsesReassembler, status_category
from . import _native
from ._sse import DEFAULT_MAX_EVENT_BYTES, SSEParser

REASSEMBLERS: dict[str, type[Reassembler]] = {
    "responses": ResponsesReassembler,
    "chat": ChatReassembler,
    "messages": MessagesReassembler,
    "completions": CompletionsReassembler,
    "generate": GenerateReassembler,
}


@dataclass(frozen=True)
class TapOutcome:
    """What the tap contributes to a capture line."""

    response: dict[str, Any] | None
    response_raw: str | None
    error_category: str | None
    stream_truncated: bool | None = None
    #: Why capture could not parse the body, for the line's ``failure`` (stage ``capture``).
    parse_failure: str | None = None


#: A stream learns at most this many event templates, and gives up learning after this many events
#: that had none (a stream of tool-call deltas, or an upstream whose JSON is not compact).
_MAX_TEMPLATES, _LEARN_ATTEMPTS = 4, 8
#: No run is shorter than this (`EventTemplate.shortest_run`: 4 events a slot); a read too short to
#: hold a run (one event at a GPU's pace) is told by its length alone (`StreamTap._run_bytes`).
_SHORTEST_RUN = 4
_TOOL_CALLS = b"[TOOL_CALLS]"

#: Bytes each dialect's terminal events contain (see `StreamTap.quiet_prefix`): chat and completions
#: end with ``[DONE]`` or a chunk with an ``"error"`` key (the fold takes nothing else for one);
#: Responses with its terminal events or an ``error`` event; Messages with ``message_stop`` or an
#: ``error`` event.
_TERMINAL_MARKERS = {"chat": (b"[DONE]", b'"error"'), "completions": (b"[DONE]", b'"error"'),
                     "generate": (b"[DONE]", b'"error"'),
                     "responses": (b"response.completed", b"response.incomplete", b"response.failed", b"error"),
                     "messages": (b"message_stop", b"error")}
#: The same where the reply ends at its last meaningful event (`reply_expectations`): the event
#: that completes it carries a finish reason, the usage or Messages' ``message_delta``. A false
#: match (``"usage":null`` on every chunk of some servers) only holds back more.
_CHOICES_WHOLE_MARKERS = (b"[DONE]", b'"error"', b'"usage"', b'"finish_reason":"', b'"finish_reason": "')
_WHOLE_MARKERS = {"chat": _CHOICES_WHOLE_MARKERS, "completions": _CHOICES_WHOLE_MARKERS,
                  "messages": (b"message_delta", b"message_stop", b"error")}


def reply_expectations(dialect: str, body: bytes, parsed: Any = None) -> dict[str, Any] | None:
    """A streamed request of ``dialect`` as far as where its reply ends depends on it (for
    `StreamTap`'s ``expect``, read by `Reassembler.expect`), or None when it cannot say: the reply
    then ends at its terminal as ever (docs/wire.md, "Durable before the agent's end").

    A reply is complete at its last meaningful event: Messages' ``message_delta`` with the stop
    reason; chat's and completions' last finish reason and the usage chunk, only where the
    request asked for it (``stream_options.include_usage``). Without that a server may still add
    a usage chunk after the finish (vLLM's ``--enable-force-include-usage``) that the line must
    keep: `StreamTap`'s ``unasked_usage`` says whether this upstream does (the reply then ends at
    it, or at the last finish reason), and until that is known the reply ends at ``[DONE]``.
    ``parsed``: the body already parsed, if it was; else
    the bytes are searched, and parsed only when they name ``n`` (a false match of
    ``include_usage`` in a message's text only makes the reply wait for a usage chunk that may
    never come, then end at ``[DONE]``: as before)."""
    if dialect == "messages":
        return {}
    if dialect not in ("chat", "completions"):
        return None
    if parsed is None:
        if b'"n"' not in body:
            asked = b'"include_usage":true' in body or b'"include_usage": true' in body
            return {"stream_options": {"include_usage": True}} if asked else {}
        parsed = parse_json_object(body)
    return parsed if type(parsed) is dict else None


class StreamTap:
    """Observe an SSE reply of ``dialect``; `feed` returns True for the chunk with the terminal."""

    def __init__(
        self,
        dialect: str,
        content_encoding: str | None = None,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        compact_arrays: bool = False,
        raw_window: int | None = None,
        templates: bool = True,
        learn_after: int = LEARN_AFTER_LINES,
        expect: dict[str, Any] | None = None,
        unasked_usage: bool | None = None,
    ) -> None:
        """``compact_arrays``: per-token lists come out as `orjson.Fragment` (see `TokenArrays`).
        ``raw_window``: keep only the stream's last this many bytes of raw text while it parses
        cleanly (``--capture-raw-stream on-failure``, where the raw text is written only for a
        stream that failed); from the first fault on, everything is kept. ``templates``: learn the stream's repeated
        events and take runs of them the fast way (`capture._event_templates`; off only to test
        that the outcome is the same), once ``learn_after`` field lines have passed. ``expect``:
        the request's `reply_expectations`: the reply then ends (`feed` returns True) at its last
        meaningful event, which is what is held until the line is durable. ``unasked_usage``:
        whether the upstream adds a usage chunk a chat or completions request did not ask for
        (vLLM's ``--enable-force-include-usage``): True, such a reply ends at it; False, at its
        last finish reason; None (not known), at its terminal (``[DONE]``), and
        `unasked_usage_seen` then says what the stream did."""
        self._parser = SSEParser(max_event_bytes)
        self._max_event_bytes = max_event_bytes
        self._reassembler = REASSEMBLERS[dialect]()
        self._terminal_markers = _TERMINAL_MARKERS[dialect]
        #: Usage was not asked and the upstream's way with it is not known: the stream shows it.
        self._shows_unasked_usage = False
        if expect is not None and dialect in _WHOLE_MARKERS:
            reassembler = self._reassembler
            reassembler.expect(expect)
            if dialect != "messages" and not reassembler.wants_usage:
                reassembler.wants_usage = unasked_usage is True  # It comes unasked: the reply ends at it.
                self._shows_unasked_usage = unasked_usage is None
            if dialect == "messages" or reassembler.wants_usage or unasked_usage is False:
                reassembler.ends_when_whole = True
                self._terminal_markers = _WHOLE_MARKERS[dialect]
        self._reassembler.compact_arrays = compact_arrays
        self._framing_failed = False
        learns = templates and type(self._reassembler).learn_template is not Reassembler.learn_template
        self._templates: list[EventTemplate] | None = [] if learns else None
        self._learn_attempts = _LEARN_ATTEMPTS if learns else 0
        #: A read shorter than this cannot hold a run worth taking (one length check per read at a
        #: GPU's pace, where every read is one event): 4 of the shortest event learnt; no read
        #: until the stream has passed ``learn_after`` lines (`_may_learn`).
        self._run_bytes = sys.maxsize
        self._learn_after: int | None = learn_after if learns else None
        #: Events taken by a template, not parsed one by one.
        self.templated_events = 0
        self._raw = bytearray()
        self._raw_window = raw_window
        #: Bytes of raw text dropped from the front by the window.
        self.raw_dropped = 0
        self._failure: str | None = None
        self._saw_bytes = False
        self.terminal = False
        self._decode: Decoder | None = None
        self._undecodable = False
        self._raw_encoding: str | None = None
        try:
            if content_encoding and content_encoding.strip().lower() != "identity":
                self._decode = make_decoder(content_encoding)
        except ValueError as exc:
            self._undecodable = True
            self._failure = str(exc)
            self._raw_encoding = content_encoding  # The raw copy holds the encoded bytes.

    @property
    def bytes_seen(self) -> int:
        """The reply's bytes taken in so far (what its line's size, and the cost of building it,
        grow with)."""
        return len(self._raw) + self.raw_dropped

    @property
    def has_content(self) -> bool:
        """True once a non-comment line arrived (the moment that defines TTFT, docs/files.md)."""
        return self._parser.field_lines > 0 or (self._failure is not None and self._saw_bytes)

    def quiet_prefix(self, data: bytes) -> int:
        """How many leading bytes of ``data`` (the next bytes of the stream) cannot complete its
        terminal event: the whole events before the first that names a terminal, found by a byte
        search (issue 34: the relay sends them before they are parsed, and holds back only the
        rest). A terminal event (``[DONE]``, an error, ``response.completed`` / ``incomplete`` /
        ``failed``, ``message_stop``) carries its name in its own bytes; a false match only holds
        back more. 0 when it cannot be known: a compressed stream, an event already begun, a
        framing already failed."""
        if self._decode is not None or self._framing_failed or self.terminal or not self._parser.between_events():
            return 0
        core = _native.core
        first = (core.first_of if core is not None else first_of)(data, self._terminal_markers)
        if first < 0:
            return len(data)
        boundary = data.rfind(b"\n\n", 0, first)  # Always an event's end, whatever the line ends.
        return boundary + 2 if boundary >= 0 else 0

    def feed(self, chunk: bytes) -> bool:
        """Observe one chunk; True when it completed the stream's terminal event."""
        self._count_toward_templates(chunk)
        return self._observe(chunk)

    @property
    def unasked_usage_seen(self) -> bool | None:
        """With no usage asked and the upstream's way with it not known (``unasked_usage`` None):
        once the stream has reached its terminal whole, whether a usage chunk came; else None."""
        if not self._shows_unasked_usage or not self.terminal or self._failure is not None \
                or self._reassembler.error_category is not None:
            return None
        return getattr(self._reassembler, "_usage", None) is not None

    def generated_so_far(self) -> dict[int, int] | None:
        """`Reassembler.generated_so_far` of this stream."""
        return self._reassembler.generated_so_far()

    def _count_toward_templates(self, chunk: bytes) -> None:
        if self._learn_after is not None and (self._parser.field_lines >= self._learn_after
                                              or len(chunk) >= LEARN_FROM_READ_BYTES):
            self._learn_after = None  # Long enough for templates to pay: runs may be taken from now on.
            self._run_bytes = _SHORTEST_RUN * 64

    def _observe(self, chunk: bytes) -> bool:
        """Keep and parse one chunk."""
        if self.terminal:
            return False
        self._saw_bytes = True
        data = chunk if self._decode is None else self._decoded(chunk)
        if data is None:
            return False
        self._keep_raw(data)
        if self._failure is None:
            for piece, whole_events in self._plain_split(data):
                try:
                    if whole_events and len(piece) >= self._run_bytes and self._parser.takes_plain(piece):
                        self._take_templates(piece)
                        continue
                    plain = self._parser.feed_plain(piece) if whole_events else None
                    if plain is not None:
                        self._fold_plain(plain)
                        continue
                except Exception as exc:  # A bug here must never reach the pump (docs/guarantees.md).
                    self._failure = f"{type(exc).__name__}: {exc}"
                    return False
                self._parse_events(piece)
        return self.terminal

    def _fold_plain(self, plain: list[tuple[str, bytes, bytes]], learn: bool = False) -> None:
        """The plain events of one read, folded; ``learn``: a template may be
        learnt from them."""
        reassembler = self._reassembler
        if not (learn and self._learn_attempts):
            reassembler.fold_plain(plain)
            self.terminal = reassembler.terminal
            return
        feed_data = reassembler.feed_data
        for event_type, event_data, part in plain:
            if self._learn_attempts:  # Parsed once for the fold and the template.
                payload = parse_json_object(event_data)
                if payload is not None:
                    reassembler.feed_payload(event_type, payload)
                    if not reassembler.terminal:
                        self._learn(part, event_type, event_data, payload)
                    continue
            feed_data(event_type, event_data)
        self.terminal = reassembler.terminal

    def _learn(self, part: bytes, event_type: str, data: bytes, payload: Any, output: bytes | None = None) -> None:
        """Learn the template of a plain event just folded, if it is a shape the reassembler takes
        in runs (``output``: its client's bytes, where they differ: `CuttingStreamTap`)."""
        templates = self._templates
        assert templates is not None
        prefix = part[:len(part) - len(data)]
        learnt = self._reassembler.learn_template(prefix, data, payload, event_type)
        template = self._usable_template(learnt, part, event_type, prefix, output) if learnt is not None else None
        if template is None:
            self._learn_attempts -= 1
            return
        template.maximum = self._max_event_bytes - 6
        templates.append(template)
        self._run_bytes = min(template.shortest_run * template.shortest for template in templates)
        if len(templates) >= _MAX_TEMPLATES:
            self._learn_attempts = 0

    def _usable_template(self, learnt: Any, part: bytes, event_type: str, prefix: bytes,
                         output: bytes | None) -> EventTemplate | None:
        """The template learnt, if runs of it can be taken as they are (an observer: always)."""
        return learnt[0]

    def _take_templates(self, piece: bytes) -> None:
        """A piece of whole plain events (`SSEParser.takes_plain`): each run of events that fits a
        learnt template taken at once (folded), each other event the general way (where a template
        may be learnt)."""
        core = _native.core
        parts = (core.split_events if core is not None else split_events)(piece)
        reassembler, parser, templates = self._reassembler, self._parser, self._templates
        assert templates is not None
        watch, takes_runs, general_event = self._watches(piece), self._takes_runs, self._general_event
        at, end = 0, len(parts)
        while at < end:
            taken, fits = 0, False
            if end - at >= _SHORTEST_RUN and self._failure is None and not reassembler.terminal and takes_runs():
                taken, fits = self._take_run(parts, at, watch)
            if taken:
                at += taken
                continue
            if self._failure is not None and not self._reads_past_failure:
                return  # Nothing more is parsed (`_observe`).
            # One event the general way; one no template fits may teach a new one.
            if not fits and templates:
                fits = any(template.may_fit(parts[at]) for template in templates)
            event = parts[at] + b"\n\n"
            general_event(event, parser.feed_plain(event), not fits)
            at += 1
        self.terminal = reassembler.terminal

    #: Whether every byte still goes through after a parse failure (`CuttingStreamTap`: its output
    #: is the client's bytes), or nothing more is parsed.
    _reads_past_failure = False

    def _watches(self, piece: bytes) -> bool:
        """Whether runs in ``piece`` must stop before an event that names a tool call."""
        return False

    def _takes_runs(self) -> bool:
        """Whether runs may be taken by templates now."""
        return True

    def _general_event(self, event: bytes, plain: list[tuple[str, bytes, bytes]] | None, learn: bool) -> None:
        """One event no run took: folded (``plain``: its parse as a plain event, if it is one)."""
        if plain is not None:
            self._fold_plain(plain, learn=learn)
        else:
            self._parse_events(event)

    def _take_run(self, parts: list[bytes], at: int, watch: bool) -> tuple[int, bool]:
        """The run at ``parts[at]`` taken by the first template it fits (counted, folded): how many
        events, and whether a template's segments fit there at all."""
        fits = False
        for template in self._templates:  # type: ignore[union-attr]  # templates are on while this runs
            count, columns = template.take_run(parts, at, template.shortest_run)
            fits = fits or count > 0
            if count < template.shortest_run:
                continue
            if watch:  # Such an event goes the general way (`_watches`).
                count = next((position for position in range(count) if _TOOL_CALLS in parts[at + position]), count)
            count, decoded = template.checked(columns, count)
            if not count:
                continue
            self._parser.took_plain(count * template.field_lines)
            self._took_run(template, columns, count)
            try:
                template.fold(columns, count, decoded)
            except Exception as exc:  # The output is complete whatever happens here.
                self._failure = f"{type(exc).__name__}: {exc}"
            self.templated_events += count
            return count, True
        return 0, fits

    def _took_run(self, template: EventTemplate, columns: list[list[bytes]], count: int) -> None:
        """A run of ``count`` events is taken (before it is folded)."""

    def collected_arrays(self) -> dict[int, tuple[list[int] | None, list[float] | None]] | None:
        """Each choice's generated ids and logprobs as they streamed: only a `CuttingStreamTap`
        collects them (docs/tokens.md)."""
        return None

    def collected(self) -> "CollectedArrays | None":
        """`collected_arrays`, kept compact until it is read."""
        return None

    def _plain_split(self, chunk: bytes) -> list[tuple[bytes, bool]]:
        """``chunk`` as the pieces to frame: the end of an event an earlier read began, the whole
        events (True: `SSEParser.feed_plain` may take them, the fast path), and the start of an
        event the next read ends. A read is cut by TCP, not by events: without this, a read that
        begins or ends mid-event would be framed line by line whole (issue 34)."""
        start = 0
        if not self._parser.between_events():
            end = chunk.find(b"\n\n")
            if end < 0:
                return [(chunk, False)]
            start = end + 2
        last = chunk.rfind(b"\n\n")
        stop = last + 2 if last + 2 > start else start
        pieces = [(chunk[:start], False)] if start else []
        if stop > start:
            pieces.append((chunk[start:stop], True) if start or stop < len(chunk) else (chunk, True))
        if stop < len(chunk):
            pieces.append((chunk[stop:], False))
        return pieces

    def _keep_raw(self, data: bytes) -> None:
        self._raw += data  # Kept even after a parse failure: the raw text is the evidence.
        window = self._raw_window
        if window is not None and len(self._raw) > 2 * window and self._failure is None \
                and not self._reassembler.undecodable_events:
            cut = len(self._raw) - window
            del self._raw[:cut]  # Amortised: at most once per `window` bytes.
            self.raw_dropped += cut

    def _parse_events(self, data: bytes) -> None:
        try:
            feed_event = self._reassembler.feed_event
            for event in self._parser.feed(data):
                feed_event(event)
        except Exception as exc:  # A bug here must never reach the pump (docs/guarantees.md).
            self._failure = f"{type(exc).__name__}: {exc}"
            return
        self.terminal = self._reassembler.terminal

    def _decoded(self, chunk: bytes) -> bytes | None:
        if self._undecodable or self._decode is None:
            return None
        try:
            return self._decode(chunk)
        except Exception as exc:  # A corrupt gzip stream: the client still gets its bytes.
            self._undecodable = True
            self._failure = f"cannot decode the body: {type(exc).__name__}: {exc}"
            return None

    def raw_text(self) -> str:
        """The stream's raw text as kept (with a note when the window dropped its start)."""
        if self._raw_encoding is not None:
            return as_evidence(self._raw_encoding, bytes(self._raw))
        raw = bytes(self._raw).decode("utf-8", "replace") if self._raw else ""
        if self.raw_dropped:
            raw = f"(the stream's first {self.raw_dropped} bytes were not kept: --capture-raw-stream on-failure keeps its end)\n" + raw
        return raw

    def seen_whole(self, request: Any) -> bool:
        """The reply's last meaningful event has come (``request``: what it asked, parsed), so a
        client leaving now has had all of it: `Reassembler.seen_whole`."""
        if self.terminal:
            return True
        if self._failure is not None:
            return False
        self._reassembler.expect(request)
        return self._reassembler.seen_whole()

    def end_seen_whole(self) -> None:
        """The client left after the last meaningful event (`seen_whole`): the reply ends there,
        complete, not truncated."""
        self.terminal = True

    def finish(self, status: int, with_raw: bool = True) -> TapOutcome:
        """The outcome for a reply with ``status`` whose body has ended (or was cut).
        ``with_raw=False``: ``response_raw`` is None (`raw_text` gives it if it is wanted after all)."""
        raw = self.raw_text() if with_raw else None
        if self._failure is not None:
            category = categorize_status(status) or "capture_parse_error"
            return TapOutcome(None, raw, category, not self.terminal, self._failure)
        try:
            response = self._reassembler.result()
        except Exception as exc:
            category = categorize_status(status) or "capture_parse_error"
            return TapOutcome(None, raw, category, not self.terminal, f"{type(exc).__name__}: {exc}")
        return TapOutcome(response, raw, self._category(status, response), not self.terminal)

    def _category(self, status: int, response: dict[str, Any] | None) -> str | None:
        if not 200 <= status < 300:
            return categorize_status(status, response)
        if self._reassembler.error_category is not None:
            return self._reassembler.error_category
        if not self.terminal:
            return "stream_truncated"
        if self._reassembler.undecodable_events or self._parser.oversized_events:
            return "capture_parse_error"
        return None


class BodyTap:
    """Collect a non-streaming body; `finish` parses the decoded copy as JSON."""

    terminal = False

    def __init__(self, dialect: str, content_encoding: str | None = None) -> None:
        self._dialect = dialect
        self._content_encoding = content_encoding
        self._chunks: list[bytes] = []

    @property
    def has_content(self) -> bool:
        return bool(self._chunks)

    @property
    def bytes_seen(self) -> int:
        return sum(map(len, self._chunks))

    def feed(self, chunk: bytes) -> bool:
        self._chunks.append(chunk)
        return False

    def finish(self, status: int) -> TapOutcome:
        try:
            body = make_decoder(self._content_encoding)(b"".join(self._chunks))
        except Exception as exc:
            raw = as_evidence(self._content_encoding, b"".join(self._chunks)) if not decodable(self._content_encoding) else None
            return TapOutcome(None, raw, categorize_status(status) or "capture_parse_error", None, str(exc))
        parsed = parse_json_object(body)
        if parsed is None:
            text = body.decode("utf-8", "replace")
            return TapOutcome(None, text, categorize_status(status) or "capture_parse_error", None,
                              "the body is not a JSON object" if 200 <= status < 300 else None)
        return TapOutcome(parsed, None, self._category(status, parsed))

    def _category(self, status: int, body: dict[str, Any]) -> str | None:
        category = categorize_status(status, body)
        if category is None and self._dialect == "responses":
            # A non-streaming Responses body says the same as the stream's terminal event would.
            category = status_category(body)
        return category


def first_of(data: bytes, markers: tuple[bytes, ...]) -> int:
    """Where the first of ``markers`` starts in ``data``, or -1 (`StreamTap.quiet_prefix`). The
    reference of the compiled core's ``first_of`` (capture/_core.c, `capture._native`)."""
    first = -1
    for marker in markers:
        at = data.find(marker)
        if at >= 0 and (first < 0 or at < first):
            first = at
    return first


def split_events(piece: bytes) -> list[bytes]:
    """A piece of whole events (its last blank line at its end), each event without its blank
    line. The reference of the compiled core's ``split_events``."""
    return piece[:-2].split(b"\n\n")


def parse_json_object(body: bytes) -> dict[str, Any] | None:
    """``body`` as a JSON object, or None when it is not exactly one."""
    try:
        parsed = orjson.loads(body)
    except (orjson.JSONDecodeError, UnicodeDecodeError):
        return None
    return parsed if isinstance(parsed, dict) else None
