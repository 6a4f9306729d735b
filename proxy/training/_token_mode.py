"""The token capture mode on the proxy's side (docs/tokens.md): which fields a call gets, and what
the sidecar learns when the upstream refuses one.

The byte work (adding to the request, cutting from the reply) is `capture`'s, sans-io; this
module holds the per-upstream memory: a field the upstream refused once is never added again,
so an older vLLM or a non-vLLM server costs one resent request per field, not one per call.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import orjson

from capture import add_request_fields, token_fields_to_add

from ..http import Headers, header_value

log = logging.getLogger("mcc.proxy")

#: The statuses of a request refused before anything was generated: 400, and FastAPI's 422 for a
#: field its model forbids (``extra="forbid"``).
REFUSAL_STATUSES = (400, 422)


class TokenMode:
    """What the token capture mode adds, per call, and what this upstream refused."""

    def __init__(self, engine: str = "vllm") -> None:
        #: Fields this upstream refused: never added again (until a restart).
        self.refused: set[str] = set()
        #: ``vllm`` or ``sglang``: which engine's fields are added (`capture.token_fields_to_add`).
        self.engine = engine
        self._said_compressed = False

    def plan(self, dialect: str, headers: Headers, body: bytes, request: Optional[dict[str, Any]] = None
             ) -> Optional[tuple[dict[str, Any], dict[str, Any], bytes]]:
        """(fields added, the agent's request parsed, the body to send), or None to send the agent's own.
        ``request``: ``body`` already parsed (not parsed twice).

        A body that is compressed or not a JSON object is sent as it came: the mode never guesses.
        """
        if header_value(headers, b"content-encoding") not in (None, b"identity"):
            return None
        if request is None:
            try:
                request = orjson.loads(body)
            except orjson.JSONDecodeError:
                return None
        if type(request) is not dict:
            return None
        fields = token_fields_to_add(dialect, request, frozenset(self.refused), self.engine)
        if not fields:
            return None
        sent = add_request_fields(body, fields)
        return (fields, request, sent) if sent is not None else None

    def learn_refusal(self, fields: dict[str, Any], status: int, error_body: bytes, upstream: str) -> list[str]:
        """The agent's own request succeeded where the one with ``fields`` was refused (``status``):
        stop adding the fields the refusal names. Logged once per field.

        The refusal's own words decide: the parameter an OpenAI-style error names (``param``, as
        vLLM writes it), the fields FastAPI's 422 lists (``detail[].loc``), else the added names in
        its text, else all of them (a refusal that names nothing still refused what was added). A
        refusal that names another parameter (vLLM's "`echo` with `logprobs` ..." names ``echo``)
        is about this request, not the upstream: nothing is learnt.
        """
        named = refused_fields(fields, error_body)
        new = [name for name in named if name not in self.refused]
        self.refused.update(named)
        if new:
            # The refusal's text is not logged: a validator's error may quote the request (FastAPI's
            # ``input``), and logs never carry content (docs/privacy.md).
            log.warning("the upstream %s refused the token capture mode's %s (%d); the agent's own request was "
                        "resent and succeeded; %s no longer added for this upstream", upstream, ", ".join(new), status,
                        "it is" if len(new) == 1 else "they are",
                        extra={"upstream": upstream, "fields": new, "status": status})
        return named

    def say_compressed(self, upstream: str) -> None:
        """A compressed success was resent as the agent's own request: said once per upstream."""
        if self._said_compressed:
            return
        self._said_compressed = True
        log.warning("the upstream %s sent a compressed reply (Content-Encoding), which the token capture mode cannot "
                    "cut; the agent's own request was resent, and such calls have no token arrays (counted in "
                    "mcc_token_mode_compressed_replies_total); the mode stays on. Serve uncompressed replies to the "
                    "sidecar (vLLM does; check any gateway between them)", upstream, extra={"upstream": upstream})


def refused_fields(fields: dict[str, Any], error_body: bytes) -> list[str]:
    """The added ``fields`` a refusal names (see `TokenMode.learn_refusal`)."""
    try:
        error = orjson.loads(error_body)
    except orjson.JSONDecodeError:
        error = None
    if type(error) is dict:
        detail = error.get("detail")
        if type(detail) is list:  # FastAPI / pydantic: [{"loc": ["body", "return_token_ids"], ...}]
            located = {step for item in detail if type(item) is dict and type(item.get("loc")) is list
                       for step in item["loc"] if type(step) is str}
            if located:
                return [name for name in fields if name in located]
        inner: dict[str, Any] = error["error"] if type(error.get("error")) is dict else error
        param = inner.get("param")
        if type(param) is str and param:
            return [name for name in fields if name == param]
    text = error_body.decode("utf-8", "replace")
    return [name for name in fields if name in text] or list(fields)
