"""`CutRelay`: the token capture mode's relay (docs/tokens.md). The agent gets the upstream's bytes
with the fields the sidecar added to the request cut out: byte spans removed by the
`AddedFieldCutter`, nothing re-serialised. Chosen by the mode's hooks at the call's ``reply_relay``
phase; the call and its pump know it only as a `ReplyRelay`."""

from __future__ import annotations

from typing import Any, Callable

from capture import AddedFieldCutter, BodyTap, CuttingStreamTap, StreamTap

from ..call import ReplyRelay


class CutRelay(ReplyRelay):
    """What the tap gives back of what it read: the reply with the call's added fields cut."""

    rewrites = True

    def __init__(self, cutter: AddedFieldCutter) -> None:
        self.cutter = cutter

    def stream_tap(self, dialect: str, content_encoding: str | None, **options: Any) -> StreamTap:
        """One reader frames the stream for the capture and the cut (`CuttingStreamTap`)."""
        return CuttingStreamTap(dialect, content_encoding, cutter=self.cutter, **options)

    def attach(self, tap: StreamTap | BodyTap | None, emit: Callable[[bytes], None]) -> None:
        if isinstance(tap, CuttingStreamTap):
            tap.emit = emit  # Each event to the agent as soon as it is cut.

    def detach(self, tap: StreamTap | BodyTap | None) -> None:
        if isinstance(tap, CuttingStreamTap):
            tap.emit = None  # A bound method of the pump: a cycle otherwise.

    def fed(self, tap: StreamTap, data: bytes) -> bytes:
        return tap.take_output()  # type: ignore[attr-defined]  # this relay's streams are CuttingStreamTaps

    def behind(self, tap: StreamTap | BodyTap | None, data: bytes) -> bytes:
        tap.feed(data)  # type: ignore[union-attr]  # the pump's tap is set where it feeds
        return tap.take_output()  # type: ignore[union-attr]  # this relay's streams are CuttingStreamTaps

    def tail(self, tap: StreamTap | BodyTap | None) -> bytes:
        return tap.close_output()  # type: ignore[union-attr]  # this relay's streams are CuttingStreamTaps

    def whole(self, tap: StreamTap | BodyTap | None, body: bytes) -> tuple[bytes, bytes]:
        """A sized body: a stream framed and cut by the tap's one reader, as a chunked stream is
        (its events before the one that completes it may go first); a JSON body cut whole."""
        if isinstance(tap, CuttingStreamTap):
            before: list[bytes] = []
            tap.emit = before.append
            tap.feed(body)
            tap.emit = None
            return b"".join(before), tap.take_output() + tap.close_output()
        if tap is not None:
            tap.feed(body)
        return b"", self.cutter.cut_body(body)
