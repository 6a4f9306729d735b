"""The token capture mode on the proxy's side (DESIGN §11): which fields a call gets, and what
the sidecar learns when the upstream refuses one.

The byte work (adding to the request, cutting from the reply) is `capture`'s, sans-io; this
module holds the per-upstream memory: a field the upstream refused once is never added again,
so an older vLLM or a non-vLLM server costs one resent request per field, not one per call.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

import orjson

from capture import add_request_fields, token_fields_to_add

from ._http1 import header_value
from ._headers import Headers

log = logging.getLogger("mcc.proxy")


class TokenMode:
    """What the token capture mode adds, per call, and what this upstream refused."""

    def __init__(self) -> None:
        #: Fields this upstream answered 400 to: never added again (until a restart).
        self.refused: set[str] = set()

    def plan(self, dialect: str, headers: Headers, body: bytes) -> Optional[tuple[dict[str, Any], dict[str, Any], bytes]]:
        """(fields added, the agent's request parsed, the body to send), or None to send the agent's own.

        A body that is compressed or not a JSON object is sent as it came: the mode never guesses.
        """
        if header_value(headers, b"content-encoding") not in (None, b"identity"):
            return None
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if type(request) is not dict:
            return None
        fields = token_fields_to_add(dialect, request, frozenset(self.refused))
        if not fields:
            return None
        sent = add_request_fields(body, fields)
        return (fields, request, sent) if sent is not None else None

    def learn_refusal(self, fields: dict[str, Any], error_body: bytes, upstream: str) -> list[str]:
        """The agent's own request succeeded where the one with ``fields`` got a 400: stop adding
        the fields the error names (all of them when it names none). Logged once per field."""
        text = error_body.decode("utf-8", "replace")
        named = [name for name in fields if name in text] or list(fields)
        new = [name for name in named if name not in self.refused]
        self.refused.update(named)
        if new:
            log.warning("the upstream %s refused the token capture mode's %s (400: %s); the agent's own request was "
                        "resent and succeeded; %s no longer added for this upstream", upstream, ", ".join(new),
                        _one_line(text), "it is" if len(new) == 1 else "they are",
                        extra={"upstream": upstream, "fields": new})
        return named


class WholeBody:
    """A body sink that gathers a whole reply (an error body, or a JSON body to cut) into ``done``.

    ``done`` resolves to the body, or to ``(body so far, kind)`` as an `UpstreamBroke` when the
    upstream failed mid-body.
    """

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def on_body(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    def flush(self) -> None:
        pass

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


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
