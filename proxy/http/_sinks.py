"""Body sinks: where an upstream reply's body goes when it is not pumped to a client (`BodySink`)."""

from __future__ import annotations

import asyncio


class WholeBody:
    """A body sink that gathers a whole reply (an error body, or a JSON body to cut) into ``done``.

    ``done`` resolves to the body, or to ``(body so far, kind)`` as an `UpstreamBroke` when the
    upstream failed mid-body.
    """

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def on_read(self, chunks: list[bytes]) -> None:
        self.chunks += chunks

    def on_end(self) -> None:
        if not self.done.done():
            self.done.set_result(b"".join(self.chunks))

    def on_error(self, kind: str, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(UpstreamBroke(b"".join(self.chunks), kind, exc))


class UpstreamBroke(Exception):
    def __init__(self, partial: bytes, kind: str, cause: BaseException) -> None:
        super().__init__(f"{kind}: {cause}")
        self.partial = partial
        self.kind = kind
        self.cause = cause
