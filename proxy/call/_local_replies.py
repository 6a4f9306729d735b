"""Replies the sidecar writes itself, in the error shape of the dialect the path implies (docs/wire.md)."""

from __future__ import annotations

from dataclasses import dataclass

from http import HTTPStatus
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from ..http import ReplyWriter

#: Header that tells a client (and a human with curl) that the sidecar, not the model, answered.
LOCAL_REPLY_HEADER = "x-mcc-local-response"


@dataclass(frozen=True)
class LocalReply:
    """One kind of local reply: its status, the error type per dialect, and why it happened."""

    status: int
    reason: str
    openai_type: str
    anthropic_type: str
    category: str


BAD_REQUEST_TARGET = LocalReply(400, "bad_request_target", "invalid_request_error", "invalid_request_error", "client_error")
INVALID_ROLLOUT_ID = LocalReply(400, "invalid_rollout_id", "invalid_request_error", "invalid_request_error", "client_error")
BODY_TOO_LARGE = LocalReply(413, "body_too_large", "invalid_request_error", "request_too_large", "client_error")
UPSTREAM_UNREACHABLE = LocalReply(502, "upstream_unreachable", "upstream_error", "api_error", "connection")
UPSTREAM_TIMEOUT = LocalReply(504, "upstream_timeout", "timeout", "timeout_error", "timeout")
#: A call for a rollout that has ended (docs/wire.md, "Ending a rollout"): Gym's freeze.
ROLLOUT_ENDED = LocalReply(409, "rollout_ended", "invalid_request_error", "invalid_request_error", "rollout_ended")
#: A path outside the model API with ``--forward model-api`` (docs/operations.md).
NOT_FORWARDED = LocalReply(404, "not_forwarded", "invalid_request_error", "not_found_error", "client_error")


def error_body(reply: LocalReply, error_dialect: str, message: str) -> dict[str, object]:
    """OpenAI ``{"error": {...}}`` or Anthropic ``{"type": "error", "error": {...}}``."""
    if error_dialect == "messages":
        return {"type": "error", "error": {"type": reply.anthropic_type, "message": message}}
    return {"error": {"message": message, "type": reply.openai_type, "param": None, "code": reply.reason}}


def send_local_reply(client: "ReplyWriter", reply: LocalReply, error_dialect: str, message: str) -> None:
    """Write the reply, JSON in the dialect's error shape, marked with `LOCAL_REPLY_HEADER`."""
    body = orjson.dumps(error_body(reply, error_dialect, message))
    client.reply(reply.status, HTTPStatus(reply.status).phrase.encode(),
                 [(b"Content-Type", b"application/json"), (LOCAL_REPLY_HEADER.encode(), reply.reason.encode())], body)
