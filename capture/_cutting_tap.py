"""`CuttingStreamTap`: the tap of the token capture mode (docs/tokens.md).

A `StreamTap` observes the bytes it is fed; this one also gives back what the agent gets of them:
each event with the fields the sidecar added to the request cut out (`AddedFieldCutter`), byte
spans removed, nothing re-serialised. One reader frames the stream for both (`SSEParser.feed_blocks`);
each event is parsed once, the cutter sees it before the fold, so its JSON of a value is reused by
the fold (`Reassembler.written`). Events after the terminal are cut, not folded. Every byte fed
comes out, whatever the parsing does: after a framing fault the rest passes as it came.
"""

from __future__ import annotations

from typing import Any, Callable

import orjson

from ._chat import CollectedArrays
from ._event_templates import EventTemplate
from ._sse import EventBlock
from ._tap import _TOOL_CALLS, StreamTap
from ._token_cutter import AddedFieldCutter

#: The client gets its cut events at least this often (`CuttingStreamTap._put`).
_EMIT_BYTES = 16 * 1024


class CuttingStreamTap(StreamTap):
    """A `StreamTap` whose `take_output` (or `emit`) gives the client's bytes: the reply with the
    call's added fields cut by ``cutter``."""

    _reads_past_failure = True

    def __init__(self, dialect: str, content_encoding: str | None = None, *, cutter: AddedFieldCutter,
                 **options: Any) -> None:
        super().__init__(dialect, content_encoding, **options)
        self._cutter = cutter
        self._output: list[bytes] = []
        #: Where the client's bytes of each event go as soon as it is cut and known not to complete
        #: the reply (the relay's write: the token mode sends as it cuts); None: everything waits
        #: in `take_output`. Once anything waits there (the event that completed the reply, what
        #: follows it), everything after it waits too, in order.
        self.emit: Callable[[bytes], None] | None = None
        #: Cut events for `emit` not given yet (`_put`), and their bytes.
        self._emitting: list[bytes] = []
        self._emitting_bytes = 0
        self._emitted = False
        #: The cutter's JSON of the current event's values, shared with the fold.
        self._reassembler.written = self._written = cutter.written
        # The mode's entry takes each token's logprob as it is parsed here (docs/tokens.md).
        self._reassembler.collect_logprobs = True
        if cutter.cuts_logprobs:
            self._reassembler.keep_logprob_entries = False

    @property
    def cutter(self) -> AddedFieldCutter:
        """The token capture mode's cutter of this stream."""
        return self._cutter

    def feed(self, chunk: bytes) -> bool:
        """Observe one chunk and cut it: every byte fed comes out (cut) in `take_output` or `emit`,
        whatever the parsing does; True when it completed the stream's terminal event."""
        self._count_toward_templates(chunk)
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

    def take_output(self) -> bytes:
        """The client's bytes for the chunks fed since the last call (those `emit` has not had:
        with it, from the event that completed the reply on)."""
        output, self._output = self._output, []
        return output[0] if len(output) == 1 else b"".join(output)

    def close_output(self) -> bytes:
        """At the end of the body: the bytes of an unterminated last event, cut as if it had ended
        (it is no event for the capture, but its bytes reach the client)."""
        if self._framing_failed or self._decode is not None:
            return b""
        try:
            block = self._parser.close_blocks()
        except Exception:
            return b""
        if block is None:
            return b""
        return self._cutter.cut_block(block)

    def collected_arrays(self) -> dict[int, tuple[list[int] | None, list[float] | None]] | None:
        """On chat: each choice's generated ids and logprobs as they streamed (see
        `ChatReassembler.collected_arrays`); None elsewhere, or when the stream had another shape."""
        collected = self.collected()
        return collected.lists() if collected is not None else None

    def collected(self) -> "CollectedArrays | None":
        """`collected_arrays`, kept compact until it is read (`CollectedArrays`)."""
        collected = getattr(self._reassembler, "collected", None)
        return collected() if collected is not None and self._failure is None else None

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
            cut = cutter.cut_part(part, event_type, event_data, payload)
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
            self._put(self._cutter.cut_block(block))
            return
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            payload = None
        cut = self._cutter.cut_block(block, payload)
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

    # -- the templates' runs, cut as they are taken (`StreamTap._take_templates`) ---------------

    def _usable_template(self, learnt: Any, part: bytes, event_type: str, prefix: bytes,
                         output: bytes | None) -> EventTemplate | None:
        """The template, if it also writes the event's cut bytes exactly as the cutter did."""
        template, marked_part, marked_payload, markers = learnt
        cut = self._cutter.cut_template(marked_part, event_type, marked_part[len(prefix):], marked_payload)
        columns: list[list[bytes]] = [[] for _ in template.kinds]
        template.take([part], 0, columns)
        if cut is None or not template.learn_output(cut[0], markers, cut[1], cut[2]) \
                or template.write(columns, 1) != output:
            return None
        return template

    def _watches(self, piece: bytes) -> bool:
        return self._cutter.watches_tool_calls and _TOOL_CALLS in piece

    def _takes_runs(self) -> bool:
        return self._cutter.takes_templates

    def _general_event(self, event: bytes, plain: list[tuple[str, bytes, bytes]] | None, learn: bool) -> None:
        if plain is not None:
            self._cut_plain(plain, learn=learn)
        else:
            for block in self._parser.feed_blocks(event):
                self._cut_block(block)

    def _took_run(self, template: EventTemplate, columns: list[list[bytes]], count: int) -> None:
        _, _, cut_values, dropped = template.output  # type: ignore[misc]  # a template's output is set once it is learnt
        self._put(template.write(columns, count))  # A run never completes a reply.
        self._cutter.took_template_events(count, cut_values, dropped)
