"""`BodyPump`: one reply body from the upstream connection to the client, from the upstream's callbacks.

The hot path of a call (docs/wire.md): per read, feed the tap and write to the client, no task
switch. The chunk that ends a captured reply is held (and the upstream paused) until the line is
durable. What the client gets of the bytes is the `ReplyRelay` the pump is given (`AS_CAME`: the
bytes themselves; a feature's relay may rewrite them), so a rewrite is not a second pump.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Callable, Optional, Protocol

from capture import BodyTap, StreamTap

from ..http import ReplyWriter, UpstreamReply
from ._exchange import CallExchange, Failure
from ._overhead import CallOverhead
from ._reply_relay import AS_CAME, ReplyRelay


class PumpedCall(Protocol):
    """What the pump needs of its call (`Call`): the client, the exchange, the line's phases."""

    client: ReplyWriter
    exchange: Optional[CallExchange]
    persisted: bool
    overhead: CallOverhead

    def persist_then(self, then: Callable[[], None], holding_back: bool = True) -> None: ...

    def note_after_end(self, data: bytes) -> None: ...

    def upstream_broke_then(self, kind: str, then: Callable[[], None]) -> None: ...


class BodyPump:
    """Moves one reply body from the upstream connection to the client, from the upstream's callbacks.

    Per chunk: feed the tap, write to the client. The chunk that ends a captured reply is held
    (and the upstream paused) until the line is durable. A slow client pauses the upstream.
    ``done`` resolves to ``ended``, ``client_gone`` or ``upstream_broke``.
    """

    def __init__(self, call: PumpedCall, upstream: UpstreamReply, tap: StreamTap | BodyTap | None,
                 relay: ReplyRelay = AS_CAME) -> None:
        self.call = call
        self.upstream = upstream
        self.client = call.client
        self.tap = tap
        #: What the client gets of the bytes.
        self.relay = relay
        #: Where body bytes go: the client's socket, through the relay when it rewrites.
        self.write = self._write_behind if relay.rewrites else call.client.write
        self.exchange = call.exchange
        self.done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        #: Bytes still expected of a sized body (a captured BodyTap), else None.
        self.remaining = upstream.content_length if isinstance(tap, BodyTap) else None
        #: Lookahead for a captured body of unknown length: its last chunk is held to the end.
        self.lookahead = isinstance(tap, BodyTap) and upstream.content_length is None
        self.held = b""
        #: The held terminal chunk's bytes as the relay gave them (they go out first).
        self.held_ready = b""
        self.first_written = False
        self.persisting = False
        self.ended = False
        #: Set when the upstream failed mid-reply: ``reset_mid_reply`` or ``timeout_mid_reply``.
        self.broken: Optional[str] = None
        if relay.rewrites:
            relay.attach(tap, self._emit)  # Each event to the client as soon as the tap has it.
        self.client.connection.on_write_flow = self._client_flow
        if self.client.connection.writing_paused:
            upstream.pause()
        upstream.attach(self)

    # -- BodySink ------------------------------------------------------------------------------

    def on_read(self, batch: list[bytes]) -> None:
        """The chunks of one upstream read: each fed to the tap, all written in one client write.

        When a chunk completes the reply, the bytes before it go out now and it is held, with
        whatever follows it, until the line is durable.
        """
        if self.done.done():
            return
        if self.client.gone:
            self._finish("client_gone")
            return
        tap, write = self.tap, self.write
        if tap is None or self.call.persisted:
            data = batch[0] if len(batch) == 1 else b"".join(batch)
            if tap is not None:
                self.call.note_after_end(data)
            write(data)
            return
        if self.persisting:  # Bytes behind the held chunk wait with it, in order.
            self.held += b"".join(batch)
            return
        overhead = self.call.overhead
        if isinstance(tap, StreamTap):
            if not overhead.first_read_at:  # A stream's first_byte runs from here (`CallOverhead`).
                overhead.first_read_at = perf_counter()
            self._flush_stream(batch[0] if len(batch) == 1 else b"".join(batch), tap)
            return
        exchange, start = self.exchange, 0
        for index, chunk in enumerate(batch):
            started = perf_counter()
            ends_reply = tap.feed(chunk)
            overhead.add_parse(perf_counter() - started)
            if exchange is not None and exchange.latency_ttft_ms is None and tap.has_content:
                exchange.mark_first_content()
            if self.remaining is not None:
                self.remaining -= len(chunk)
                ends_reply = self.remaining <= 0
            if ends_reply:
                write(b"".join(batch[start:index]))
                self.held = b"".join(batch[index:])
                self._persist_then_flush()
                return
            if not self.first_written and not self.lookahead:
                self.first_written = True  # The first bytes go out before the rest is parsed: TTFT.
                write(chunk)
                start = index + 1
        batch = batch[start:]
        if not batch and not self.lookahead:
            return
        data = batch[0] if len(batch) == 1 else b"".join(batch)
        if self.lookahead:  # Write what came before; this read may be the body's last.
            data, self.held = self.held, data
        write(data)

    def _flush_stream(self, data: bytes, tap: StreamTap) -> None:
        """`on_read` for a stream: one read's bytes, relayed first and parsed after (issue 34).

        Relayed as they came, the whole events before the first that may end the reply
        (`StreamTap.quiet_prefix`) go to the client before they are parsed, then the tap takes the
        read in one pass; through a relay that rewrites, the tap gives each event to the client as
        soon as it has it (`_emit`). What ends the reply is held, with what follows it, until the line
        is durable (docs/wire.md).
        """
        relay = self.relay
        sent = 0
        if not relay.rewrites:
            quiet = tap.quiet_prefix(data)
            if quiet == len(data):
                self._write_quiet(data, tap)
                return
            if quiet:  # The quiet events go out now, and the tap reads the read in one pass.
                self.client.write(data[:quiet])
                self.first_written, sent = True, quiet
        # A relay that rewrites: the tap gives each event to the client as soon as it has it and
        # known not to complete the reply (`_emit`); what it gives back here is the rest.
        started = perf_counter()
        ends_reply = tap.feed(data)
        self.call.overhead.add_parse(perf_counter() - started)
        out = relay.fed(tap, data)
        if sent:
            out = out[sent:]  # What is left to write (or hold) of the read.
        exchange = self.exchange
        if exchange is not None and exchange.latency_ttft_ms is None and tap.has_content:
            exchange.mark_first_content()
        if ends_reply:
            self.held_ready = out  # The terminal event's bytes, and those behind it, as relayed.
            self._persist_then_flush()
            return
        self.first_written = True
        self.client.write(out)

    def _unhook_tap(self) -> None:
        """The tap no longer writes to this pump (its `emit` is a bound method: a cycle otherwise)."""
        self.relay.detach(self.tap)

    def _emit(self, events: bytes) -> None:
        """The client's bytes of events the tap has just given back (`ReplyRelay.attach`)."""
        self.client.write(events)
        self.first_written = True
        exchange = self.exchange
        if exchange is not None and exchange.latency_ttft_ms is None and self.tap.has_content:  # type: ignore[union-attr]  # a stream has a tap
            exchange.mark_first_content()

    def _write_quiet(self, events: bytes, tap: StreamTap) -> None:
        """Whole events that cannot complete the terminal: to the client and the tap (`ReplyRelay.quiet`)."""
        started = perf_counter()
        self.relay.quiet(self.client, tap, events)  # Their write is a buffer's append: counted in ``parse``.
        self.call.overhead.add_parse(perf_counter() - started)
        self.first_written = True
        exchange = self.exchange
        if exchange is not None and exchange.latency_ttft_ms is None and tap.has_content:
            exchange.mark_first_content()

    def on_end(self) -> None:
        self.ended = True
        if self.done.done() or self.persisting:
            return  # The persist in flight finishes the reply.
        if self.tap is not None and not self.call.persisted:
            self._persist_then_flush()
            return
        self._flush_and_end()

    def on_error(self, kind: str, exc: BaseException) -> None:
        if self.done.done() or self.broken is not None:
            return
        if kind == "timeout":
            note_broken(self.exchange, "timeout", exc, "the upstream stopped sending within the read timeout")
            self.broken = "timeout_mid_reply"
        else:
            note_broken(self.exchange, None, exc, f"the upstream connection failed mid-reply: {exc}")
            self.broken = "reset_mid_reply"
        if not self.persisting:  # Else the persist in flight flushes what is held, then breaks.
            self.held = b""  # A lookahead chunk never completed a reply.
            self._write_tail()  # The part of an event that came, as a direct client sees it.
            self._break()

    def _write_behind(self, data: bytes) -> None:
        """Bytes behind the terminal event, as the relay gives them (the tap folds them no more)."""
        self.client.write(self.relay.behind(self.tap, data))

    def _write_tail(self) -> None:
        """End of body: an unterminated last event, as the relay gives it (rewritten as if it had ended)."""
        tail = self.relay.tail(self.tap)
        if tail:
            self.client.write(tail)

    def _client_flow(self, paused: bool) -> None:
        if paused:
            self.upstream.pause()
        elif not self.persisting:
            self.upstream.resume()

    def _persist_then_flush(self) -> None:
        self.persisting = True
        if self.remaining is None or self.remaining > 0:
            # More may follow the held chunk (a stream's `[DONE]`, its last frame): bounded by
            # pausing the upstream. A sized body received whole has nothing left to read, and
            # skips the two epoll changes of a pause and resume.
            self.upstream.pause()
        self.call.persist_then(self._after_persist)

    def _after_persist(self) -> None:
        self.persisting = False
        if self.done.done():
            return
        if self.held or self.held_ready:  # What came with and behind the event that ended the reply.
            self.call.note_after_end(self.held_ready + self.held)
        if self.ended and self.broken is None:
            self._flush_and_end()
            return
        # Broken: what arrived before the failure, then the break.
        self._release_held(tail=self.broken is not None)
        if self.broken is not None:
            self._break()
        elif not self.client.connection.writing_paused:
            self.upstream.resume()

    def _release_held(self, tail: bool, end: bool = False) -> None:
        """What was held back, in one socket write (`ReplyWriter.cork`); ``tail``: the relay's
        end of an unterminated last event after it; ``end``: the reply's end too."""
        client = self.client
        if end and not self.held and (not tail or not self.relay.rewrites):
            last, self.held_ready = self.held_ready, b""
            client.end(last)  # The terminal's bytes and the reply's end: one write.
            return
        client.cork()
        try:
            if self.held_ready:
                client.write(self.held_ready)
                self.held_ready = b""
            if self.held:
                self.write(self.held)
                self.held = b""
            if tail and self.relay.rewrites:  # Relayed as it came, an unfinished event already went out.
                self._write_tail()
            if end:
                client.end()
        finally:
            client.uncork()

    def _flush_and_end(self) -> None:
        self._release_held(tail=True, end=True)
        self._finish("ended")

    def _break(self) -> None:
        self.call.upstream_broke_then(self.broken or "reset_mid_reply", lambda: self._finish("upstream_broke"))

    def _finish(self, outcome: str) -> None:
        self._unhook_tap()
        self.client.connection.on_write_flow = None
        self.write = _write_nothing  # A bound method of its own: a cycle left to the collector.
        if not self.done.done():
            self.done.set_result(outcome)

    def stop(self) -> None:
        """The handler was cancelled (the client left): stop listening to the upstream."""
        self._unhook_tap()
        self.client.connection.on_write_flow = None
        self.write = _write_nothing
        if not self.done.done():
            self.done.cancel()


def _write_nothing(data: bytes) -> None:
    pass


def note_broken(exchange: CallExchange | None, category: str | None, exc: BaseException, message: str) -> None:
    if exchange is None:
        return
    status = exchange.status_code or 0
    if category is None and 200 <= status < 300:
        category = "stream_truncated"
    exchange.category_override = category
    exchange.failure = Failure("stream", category or "upstream_error", message, type(exc).__name__, True)
