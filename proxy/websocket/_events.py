"""The Responses WebSocket mode's messages (docs/wire.md): what a client sends, what ends a response.

A client sends ``{"type": "response.create", ...}`` whose other fields are a ``POST /v1/responses``
body (``stream`` implicit, ``background`` not allowed); ``"generate": false`` prewarms (a response
with no output, to warm the socket's state). The server answers with the events a streamed
``POST`` sends, one per text message, in order; a response ends at ``response.completed``,
``response.failed``, ``response.incomplete`` or an ``error`` event (which, on a socket, ends the
response it answers: nothing follows it for that response).
"""

from __future__ import annotations

from typing import Any, Optional

import orjson

CREATE = "response.create"
#: The events after which nothing more comes for the response they answer.
ENDING_EVENTS = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})


def parsed_message(payload: bytes) -> Optional[dict[str, Any]]:
    """A text message's JSON object, else None."""
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def create_body(event: dict[str, Any]) -> dict[str, Any]:
    """The ``POST /v1/responses`` body a ``response.create`` stands for: its fields without ``type``,
    streamed (the socket always streams)."""
    body = {key: value for key, value in event.items() if key != "type"}
    body["stream"] = True
    return body


def as_sse_event(payload: bytes, event: Optional[dict[str, Any]]) -> bytes:
    """One server message as the SSE event a streamed ``POST`` would carry, for the capture's
    reassembler (the same rules as over HTTP). A payload spread over lines is written on one."""
    if b"\n" in payload or b"\r" in payload:
        payload = orjson.dumps(event) if event is not None else payload.replace(b"\r", b"").replace(b"\n", b"")
    name = event.get("type") if event is not None else None
    if isinstance(name, str) and name.isascii() and "\n" not in name and "\r" not in name:
        return b"event: %s\ndata: %s\n\n" % (name.encode(), payload)
    return b"data: %s\n\n" % payload


def error_event(status: int, error: dict[str, Any]) -> bytes:
    """The socket's error event (the shape OpenAI's WebSocket mode sends): a status and the error."""
    return orjson.dumps({"type": "error", "status": status, "error": error})


def error_of_reply(status: int, body: bytes) -> dict[str, Any]:
    """The ``error`` object of an upstream's HTTP error reply, as an error event carries it: its own
    ``error`` when it has one (OpenAI's and vLLM's shape), else a message made of its text."""
    parsed = parsed_message(body)
    if parsed is not None and isinstance(parsed.get("error"), dict):
        return parsed["error"]
    if parsed is not None and isinstance(parsed.get("message"), str):  # vLLM's older {"object": "error", ...}
        return {"type": parsed.get("type") or "upstream_error", "message": parsed["message"],
                "code": parsed.get("code")}
    text = body.decode("utf-8", "replace").strip()[:2000]
    return {"type": "upstream_error", "message": f"the model server answered HTTP {status}" + (f": {text}" if text else "")}


__all__ = ["CREATE", "ENDING_EVENTS", "as_sse_event", "create_body", "error_event", "error_of_reply", "parsed_message"]
