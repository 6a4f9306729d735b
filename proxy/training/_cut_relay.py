"""`CutRelay`: the token capture mode's relay (docs/tokens.md). The agent gets the upstream's bytes
with the fields the sidecar added to the request cut out: byte spans removed by the
`AddedFieldCutter`, nothing re-serialised. Chosen by the mode's hooks at the call's ``reply_relay``
phase; the call and its pump know it only as a `ReplyRelay`."""

from __future__ import annotations

from typing import Any, Callable

from capture import AddedFieldCutter, BodyTap, CuttingStreamTap, StreamTap

from ..call import ReplyRelay


class CutRelay(ReplyRelay):
    """What the tap gives back of what it read: the reply with the call's added fields cut. One per
    call: it keeps the stream's tap it made (`stream_tap`), the one reader that frames and cuts, and
    works through it; a JSON body (no stream tap) is cut whole by the cutter."""

    rewrites = True

    def __init__(self, cutter: AddedFieldCutter) -> None:
        self.cutter = cutter
        #: The stream's tap, once `stream_tap` made it (None for a JSON body).
        self.cutting: CuttingStreamTap | None = None

    def stream_tap(self, dialect: str, content_encoding: str | None, **options: Any) -> StreamTap:
        """One reader frames the stream for the capture and the cut (`CuttingStreamTap`)."""
        self.cutting = CuttingStreamTap(dialect, content_encoding, cutter=self.cutter, **options)
        return self.cutting

    def attach(self, tap: StreamTap | BodyTap | None, emit: Callable[[bytes], None]) -> None:
        if self.cutting is not None:
            self.cutting.emit = emit  # Each event to the agent as soon as it is cut.

    def detach(self, tap: StreamTap | BodyTap | None) -> None:
        if self.cutting is not None:
            self.cutting.emit = None  # A bound method of the pump: a cycle otherwise.

    def fed(self, tap: StreamTap, data: bytes) -> bytes:
        return self._stream().take_output()

    def behind(self, tap: StreamTap | BodyTap | None, data: bytes) -> bytes:
        cutting = self._stream()
        cutting.feed(data)
        return cutting.take_output()

    def tail(self, tap: StreamTap | BodyTap | None) -> bytes:
        return self._stream().close_output()

    def whole(self, tap: StreamTap | BodyTap | None, body: bytes) -> tuple[bytes, bytes]:
        """A sized body: a stream framed and cut by the tap's one reader, as a chunked stream is
        (its events before the one that completes it may go first); a JSON body cut whole."""
        cutting = self.cutting
        if cutting is not None:
            before: list[bytes] = []
            cutting.emit = before.append
            cutting.feed(body)
            cutting.emit = None
            return b"".join(before), cutting.take_output() + cutting.close_output()
        if tap is not None:
            tap.feed(body)
        return b"", self.cutter.cut_body(body)

    def _stream(self) -> CuttingStreamTap:
        """The stream's tap: the pump reads a stream only through the tap this relay made."""
        if self.cutting is None:
            raise RuntimeError("CutRelay: a stream relayed through a tap it did not make")
        return self.cutting
