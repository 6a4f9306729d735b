"""The tap: a sans-io observer of one reply's body, fed a copy of each chunk as it passes.

`StreamTap` parses an SSE reply as it streams and reports the chunk that completes the terminal
event, so the proxy can hold exactly that chunk until the capture line is durable (docs/wire.md).
`BodyTap` collects a non-streaming body. Both end with `finish`, which says what goes on the
capture line. Neither ever raises into the proxy's pump: a bug becomes ``capture_parse_error``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import orjson

from ._categories import categorize_status
from ._chat import ChatReassembler
from ._completions import CompletionsReassembler
from ._decoding import Decoder, as_evidence, decodable, make_decoder
from ._event_templates import LEARN_AFTER_LINES, LEARN_FROM_READ_BYTES, EventTemplate
from ._messages import MessagesReassembler
from ._reassembler import Reassembler
from ._responses import ResponsesReassembler, status_category
from ._sse import DEFAULT_MAX_EVENT_BYTES, EventBlock, SSEParser

if TYPE_CHECKING:
    from ._token_cutter import AddedFieldCutter

REASSEMBLERS: dict[str, type[Reassembler]] = {
    "responses": ResponsesReassembler,
    "chat": ChatReassembler,
    "messages": MessagesReassembler,
    "completions": CompletionsReassembler,
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
#: The token capture mode gives the client its cut events at least this often (`StreamTap._put`).
_EMIT_BYTES = 16 * 1024
_TOOL_CALLS = b"[TOOL_CALLS]"

#: Bytes each dialect's terminal events contain (see `StreamTap.quiet_prefix`): chat and completions
#: end with ``[DONE]`` or a chunk with an ``"error"`` key (the fold takes nothing else for one);
#: Responses with its terminal events or an ``error`` event; Messages with ``message_stop`` or an
#: ``error`` event.
_TERMINAL_MARKERS = {"chat": (b"[DONE]", b'"error"'), "completions": (b"[DONE]", b'"error"'),
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
    request asked for it (``stream_options.include_usage``): without that a server may still add
    a usage chunk after the finish (vLLM's ``--enable-force-include-usage``) that the line must
    keep, so the reply ends at ``[DONE]``. ``parsed``: the body already parsed, if it was; else
    the bytes are searched, and parsed only when they name ``n`` (a false match of
    ``include_usage`` in a message's text only makes the reply wait for a usage chunk that may
    never come, then end at ``[DONE]``: as before)."""
    if dialect == "messages":
        return {}
    if dialect not in ("chat", "completions"):
        return None
    if parsed is None:
        if b'"include_usage":true' not in body and b'"include_usage": true' not in body:
            return None
        if b'"n"' not in body:
            return {"stream_options": {"include_usage": True}}
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
        cutter: "AddedFieldCutter | None" = None,
        templates: bool = True,
        learn_after: int = LEARN_AFTER_LINES,
        expect: dict[str, Any] | None = None,
    ) -> None:
        """``compact_arrays``: per-token lists come out as `orjson.Fragment` (see `TokenArrays`).
        ``raw_window``: keep only the stream's last this many bytes of raw text while it parses
        cleanly (``--capture-raw-stream on-failure``, where the raw text is written only for a
        stream that failed); from the first fault on, everything is kept. ``cutter``: the token
        capture mode's (docs/tokens.md): each event is parsed once for both, and `take_output` gives
        the bytes for the client, the added fields cut. ``templates``: learn the stream's repeated
        events and take runs of them the fast way (`capture._event_templates`; off only to test
        that the outcome is the same), once ``learn_after`` field lines have passed. ``expect``:
        the request's `reply_expectations`: the reply then ends (`feed` returns True) at its last
        meaningful event, which is what is held until the line is durable."""
        self._parser = SSEParser(max_event_bytes)
        self._max_event_bytes = max_event_bytes
        self._reassembler = REASSEMBLERS[dialect]()
        self._terminal_markers = _TERMINAL_MARKERS[dialect]
        if expect is not None and dialect in _WHOLE_MARKERS:
            self._reassembler.expect(expect)
            if dialect == "messages" or self._reassembler.wants_usage:  # Else a usage chunk may follow.
                self._reassembler.ends_when_whole = True
                self._terminal_markers = _WHOLE_MARKERS[dialect]
        self._reassembler.compact_arrays = compact_arrays
        self._cutter = cutter
        self._output: list[bytes] = []
        #: With a cutter: where the client's bytes of each event go as soon as it is cut and known
        #: not to complete the reply (the relay's write: issue 55, the token mode sends as it
        #: cuts); None: everything waits in `take_output`. Once anything waits there (the event
        #: that completed the reply, what follows it), everything after it waits too, in order.
        self.emit: Callable[[bytes], None] | None = None
        #: Cut events for `emit` not given yet (`_put`), and their bytes.
        self._emitting: list[bytes] = []
        self._emitting_bytes = 0
        self._emitted = False
        #: The cutter's JSON of the current event's values, shared with the fold.
        self._written: dict[int, bytes] = {}
        if cutter is not None:
            self._reassembler.written = self._written = cutter.written
            # The mode's entry takes each token's logprob as it is parsed here (docs/tokens.md).
            self._reassembler.collect_logprobs = True
            if cutter.cuts_logprobs:
                self._reassembler.keep_logprob_entries = False
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

    def take_output(self) -> bytes:
        """With a cutter: the client's bytes for the chunks fed since the last call (those `emit`
        has not had: with it, from the event that completed the reply on)."""
        output, self._output = self._output, []
        return output[0] if len(output) == 1 else b"".join(output)

    @property
    def cutter(self) -> "AddedFieldCutter | None":
        """The token capture mode's cutter of this stream, if any."""
        return self._cutter

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
        first = -1
        for marker in self._terminal_markers:
            at = data.find(marker)
            if at >= 0 and (first < 0 or at < first):
                first = at
        if first < 0:
            return len(data)
        boundary = data.rfind(b"\n\n", 0, first)  # Always an event's end, whatever the line ends.
        return boundary + 2 if boundary >= 0 else 0

    def feed(self, chunk: bytes) -> bool:
        """Observe one chunk; True when it completed the stream's terminal event."""
        if self._learn_after is not None and (self._parser.field_lines >= self._learn_after
                                              or len(chunk) >= LEARN_FROM_READ_BYTES):
            self._learn_after = None  # Long enough for templates to pay: runs may be taken from now on.
            self._run_bytes = _SHORTEST_RUN * 64
        if self._cutter is not None:
            return self._feed_and_cut(chunk)
        return self._observe(chunk)

    def _feed_and_cut(self, chunk: bytes) -> bool:
        """`feed` with the cutter: every byte fed comes out (cut) in `take_output`, whatever the
        parsing does. One reader frames the stream for both (`SSEParser.feed_blocks`); each event
        is parsed once, the cutter sees it before the fold, so its JSON of a value can be reused by
        the fold (`Reassembler.written`). Events after the terminal are cut, not folded."""
        if self._decode is not None or self._framing_failed:  # Nothing to frame: passed on as it came.
            self._output.append(chunk)
            return self._observe(chunk)
        if not self.terminal:
            self._saw_bytes = True
            self._keep_raw(chunk)
        try:
            for piece, whole_events in self._plain_split(chunk):
                if whole_events and len(piece) >= self._run_bytes and self._parser.takes_plain(piece):
                    # Long enough for a template's run to pay (shorter reads: the general way).
                    self._take_templates(piece)
                    continue
                plain = self._parser.feed_plain(piece) if whole_events else None
                if plain is not None:
                    self._cut_plain(plain)
                else:
                    for block in self._parser.feed_blocks(piece):
                        self._cut_block(block)
        except Exception as exc:  # A bug in the framing: the rest passes as it comes (docs/guarantees.md).
            self._failure = self._failure or f"{type(exc).__name__}: {exc}"
            self._framing_failed = True
            self._output.append(chunk)
        if self._emitting:
            self._flush_emitted()
        self.terminal = self._reassembler.terminal
        return self.terminal

    def _put(self, output: bytes) -> None:
        """The client's bytes of an event just cut and folded: for `emit` while nothing waits and
        the reply is not complete (its completing event is held until the line is durable).

        Given to `emit` at once for the stream's first event (its first byte), then every
        `_EMIT_BYTES` and at the end of each read: a socket write costs 20-90 µs on loopback, so a
        write per event of a read that holds hundreds would cost more than the wait it saves (an
        event waits for at most `_EMIT_BYTES` of cutting behind it: about 0.1 ms)."""
        if self.emit is not None and not self._output and not self._reassembler.terminal and not self._failure:
            self._emitting.append(output)
            self._emitting_bytes += len(output)
            if self._emitting_bytes >= _EMIT_BYTES or not self._emitted:
                self._flush_emitted()
        else:
            if self._emitting:
                self._flush_emitted()  # They came before what waits: the order holds.
            self._output.append(output)

    def _flush_emitted(self) -> None:
        emitting, self._emitting, self._emitting_bytes = self._emitting, [], 0
        if emitting and self.emit is not None:
            self._emitted = True
            self.emit(emitting[0] if len(emitting) == 1 else b"".join(emitting))

    def _cut_plain(self, plain: list[tuple[str, bytes, bytes]], learn: bool = False) -> None:
        """The plain events of one read: each parsed once, cut, then folded (the hot path: inline)."""
        cutter, put, written, reassembler = self._cutter, self._put, self._written, self._reassembler
        for event_type, event_data, part in plain:
            try:
                payload = orjson.loads(event_data)
            except orjson.JSONDecodeError:
                payload = None
            cut = cutter.cut_part(part, event_type, event_data, payload)  # type: ignore[union-attr]  # cutting only with a cutter
            if self._failure is None and not reassembler.terminal:
                try:
                    if type(payload) is dict:
                        reassembler.feed_payload(event_type, payload)
                        if learn and self._learn_attempts:
                            self._learn(part, event_type, event_data, payload, cut)
                    else:
                        reassembler.feed_data(event_type, event_data)
                except Exception as exc:  # The output is complete whatever happens here.
                    self._failure = f"{type(exc).__name__}: {exc}"
            put(cut)  # Folded first: the event that completes the reply waits (`_put`).
            if written:
                written.clear()

    def _cut_block(self, block: EventBlock) -> None:
        data = block.data
        if data is None:
            self._put(self._cutter.cut_block(block))  # type: ignore[union-attr]  # cutting only with a cutter
            return
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            payload = None
        cut = self._cutter.cut_block(block, payload)  # type: ignore[union-attr]  # cutting only with a cutter
        self._fold(block.event_type, data, payload)
        self._put(cut)
        if self._written:
            self._written.clear()

    def _fold(self, event_type: str, data: bytes, payload: Any) -> None:
        if self._failure is not None or self.terminal:
            return
        try:
            if type(payload) is dict:
                self._reassembler.feed_payload(event_type, payload)
            else:
                self._reassembler.feed_data(event_type, data)
        except Exception as exc:  # The output is complete whatever happens here.
            self._failure = f"{type(exc).__name__}: {exc}"
        self.terminal = self._reassembler.terminal

    def generated_so_far(self) -> dict[int, int] | None:
        """`Reassembler.generated_so_far` of this stream."""
        return self._reassembler.generated_so_far()

    def collected_arrays(self) -> dict[int, tuple[list[int] | None, list[float] | None]] | None:
        """With a cutter, on chat: each choice's generated ids and logprobs as they streamed (see
        `ChatReassembler.collected_arrays`); None elsewhere, or when the stream had another shape."""
        collected = getattr(self._reassembler, "collected_arrays", None)
        return collected() if collected is not None and self._cutter is not None and self._failure is None else None

    def close_output(self) -> bytes:
        """With a cutter, at the end of the body: the bytes of an unterminated last event, cut as
        if it had ended (it is no event for the capture, but its bytes reach the client)."""
        if self._framing_failed or self._decode is not None:
            return b""
        try:
            block = self._parser.close_blocks()
        except Exception:
            return b""
        if block is None:
            return b""
        return self._cutter.cut_block(block) if self._cutter is not None else block.raw

    def _observe(self, chunk: bytes) -> bool:
        """Keep and parse one chunk (`feed` without a cutter, or a chunk the cutter cut alone)."""
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
        """The plain events of one read, folded (without a cutter); ``learn``: a template may be
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
        """Learn the template of a plain event just folded (and cut, with the cutter: ``output`` is
        its client's bytes), if it is a shape the reassembler takes in runs."""
        templates = self._templates
        assert templates is not None
        prefix = part[:len(part) - len(data)]
        learnt = self._reassembler.learn_template(prefix, data, payload, event_type)
        template = learnt[0] if learnt is not None else None
        if template is not None and self._cutter is not None:
            _, marked_part, marked_payload, markers = learnt  # type: ignore[misc]  # learnt is not None when template is not
            cut = self._cutter.cut_template(marked_part, event_type, marked_part[len(prefix):], marked_payload)
            columns: list[list[bytes]] = [[] for _ in template.kinds]
            template.take([part], 0, columns)
            if cut is None or not template.learn_output(cut[0], markers, cut[1], cut[2]) \
                    or template.write(columns, 1) != output:
                template = None
        if template is None:
            self._learn_attempts -= 1
            return
        template.maximum = self._max_event_bytes - 6
        templates.append(template)
        self._run_bytes = min(template.shortest_run * template.shortest for template in templates)
        if len(templates) >= _MAX_TEMPLATES:
            self._learn_attempts = 0

    def _take_templates(self, piece: bytes) -> None:
        """A piece of whole plain events (`SSEParser.takes_plain`): each run of events that fits a
        learnt template taken at once (folded, and cut with the cutter), each other event the
        general way (where a template may be learnt)."""
        parts = piece[:-2].split(b"\n\n")
        reassembler, parser, cutter, templates = self._reassembler, self._parser, self._cutter, self._templates
        assert templates is not None
        watch = cutter is not None and cutter.watches_tool_calls and _TOOL_CALLS in piece
        at, end = 0, len(parts)
        while at < end:
            taken, fits = 0, False
            if end - at >= _SHORTEST_RUN and self._failure is None and not reassembler.terminal \
                    and (cutter is None or cutter.takes_templates):
                taken, fits = self._take_run(parts, at, watch)
            if taken:
                at += taken
                continue
            if cutter is None and self._failure is not None:
                return  # Nothing more is parsed (`_observe`).
            # One event the general way; one no template fits may teach a new one.
            if not fits and templates:
                fits = any(template.may_fit(parts[at]) for template in templates)
            event = parts[at] + b"\n\n"
            plain = parser.feed_plain(event)
            if cutter is None:
                if plain is not None:
                    self._fold_plain(plain, learn=not fits)
                else:
                    self._parse_events(event)
            elif plain is not None:
                self._cut_plain(plain, learn=not fits)
            else:
                for block in parser.feed_blocks(event):
                    self._cut_block(block)
            at += 1
        self.terminal = reassembler.terminal

    def _take_run(self, parts: list[bytes], at: int, watch: bool) -> tuple[int, bool]:
        """The run at ``parts[at]`` taken by the first template it fits (cut, counted, folded): how
        many events, and whether a template's segments fit there at all."""
        fits = False
        for template in self._templates:  # type: ignore[union-attr]  # templates are on while this runs
            count, columns = template.take_run(parts, at, template.shortest_run)
            fits = fits or count > 0
            if count < template.shortest_run:
                continue
            if watch:  # Such a text makes the cutter follow a tool call: it goes the general way.
                count = next((position for position in range(count) if _TOOL_CALLS in parts[at + position]), count)
            count, decoded = template.checked(columns, count)
            if not count:
                continue
            self._parser.took_plain(count * template.field_lines)
            cutter = self._cutter
            if cutter is not None:
                _, _, cut_values, dropped = template.output  # type: ignore[misc]  # a template's output is set once it is learnt
                self._put(template.write(columns, count))  # A run never completes a reply.
                cutter.took_template_events(count, cut_values, dropped)
            try:
                template.fold(columns, count, decoded)
            except Exception as exc:  # The output is complete whatever happens here.
                self._failure = f"{type(exc).__name__}: {exc}"
            self.templated_events += count
            return count, True
        return 0, fits

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


def parse_json_object(body: bytes) -> dict[str, Any] | None:
    """``body`` as a JSON object, or None when it is not exactly one."""
    try:
        parsed = orjson.loads(body)
    except (orjson.JSONDecodeError, UnicodeDecodeError):
        return None
    return parsed if isinstance(parsed, dict) else None
