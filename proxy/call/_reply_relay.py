"""`ReplyRelay`: what the agent gets of a reply's bytes (docs/layout.md, docs/wire.md).

The call and its pump move bytes; a relay says which. `AS_CAME`, the relay of every call no
feature speaks for, gives the bytes as they came and taps them with a plain `StreamTap`. A feature
that must rewrite a reply (the token capture mode cuts the fields it added: docs/tokens.md)
chooses its own relay at the call's ``reply_relay`` phase (`CallHooks.reply_relay`); the call,
the pump and the tap know only this interface, never the feature.
"""

from __future__ import annotations

from typing import Any, Callable

from capture import BodyTap, StreamTap

from ..http import ReplyWriter


class ReplyRelay:
    """The agent gets a reply's bytes as they came."""

    #: Whether the agent's bytes are other than those that came: then a sized body is read whole
    #: first (its length changes: `whole`), and a stream's events go out as the tap gives them
    #: back (`attach`'s ``emit``, then `fed`).
    rewrites = False

    def stream_tap(self, dialect: str, content_encoding: str | None, **options: Any) -> StreamTap:
        """The tap of a streamed reply this relay reads through."""
        return StreamTap(dialect, content_encoding, **options)

    def attach(self, tap: StreamTap | BodyTap | None, emit: Callable[[bytes], None]) -> None:
        """The pump starts: ``emit`` writes the agent's bytes as soon as the tap has them."""

    def detach(self, tap: StreamTap | BodyTap | None) -> None:
        """The pump is done with ``tap``."""

    def quiet(self, client: ReplyWriter, tap: StreamTap, events: bytes) -> None:
        """Whole events that cannot complete the terminal: to the client, then to the tap."""
        client.write(events)
        tap.feed(events)  # Cannot complete the terminal event.

    def fed(self, tap: StreamTap, data: bytes) -> bytes:
        """The client's bytes of ``data``, which the tap has just read."""
        return data

    def behind(self, tap: StreamTap | BodyTap | None, data: bytes) -> bytes:
        """The client's bytes of ``data``, which came behind the terminal (the tap folds no more)."""
        return data

    def tail(self, tap: StreamTap | BodyTap | None) -> bytes:
        """At the body's end: the client's bytes of an unterminated last event."""
        return b""

    def whole(self, tap: StreamTap | BodyTap | None, body: bytes) -> tuple[bytes, bytes]:
        """A sized body read whole (only for a relay that `rewrites`), fed to the tap: the agent's
        bytes as (those that may go before the line is durable, the rest)."""
        if tap is not None:
            tap.feed(body)
        return b"", body


AS_CAME = ReplyRelay()
