"""Error categories of an upstream reply (docs/files.md). First match wins."""

from __future__ import annotations

import re
from typing import Any

#: The closed set of categories a capture line may carry (docs/files.md); ``None`` means success.
ERROR_CATEGORIES = frozenset(
    {
        "context_length_exceeded",
        "timeout",
        "rate_limit",
        "auth",
        "not_found",
        "client_error",
        "upstream_error",
        "connection",
        "cancelled",
        "incomplete",
        "aborted",
        "stream_truncated",
        "capture_parse_error",
        # A call that came after its rollout's end: refused by the sidecar (409), never a turn.
        "rollout_ended",
    }
)

# vLLM: "This model's maximum context length is N tokens. However, you requested ..." and
# "'max_tokens' ... is too large ... maximum context length is N tokens"; Anthropic:
# "prompt is too long: N tokens > M maximum".
_CONTEXT_LENGTH_MESSAGES = re.compile(
    r"maximum context length is \d+ tokens|prompt is too long: \d+ tokens > \d+ maximum",
    re.IGNORECASE,
)


def categorize_status(status: int, body: Any = None) -> str | None:
    """The category of an upstream reply with ``status`` and its parsed JSON ``body``."""
    if 200 <= status < 400:
        return None
    if status == 400 and is_context_length_error(body):
        return "context_length_exceeded"
    if status in (408, 504):
        return "timeout"
    if status == 429:
        return "rate_limit"
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status < 500:
        return "client_error"
    return "upstream_error"


def is_aborted_reply(response: Any) -> bool:
    """A reply the engine cut short itself: a choice ends ``finish_reason: "abort"`` (vLLM aborts
    requests around a weight update, ``pause_generation``; issue 32). Its generation never ended:
    the ``aborted`` category, never trained on (a later call may resume it)."""
    choices = response.get("choices") if type(response) is dict else None
    if type(choices) is list:
        for choice in choices:
            if type(choice) is dict and choice.get("finish_reason") == "abort":
                return True
    return False


def is_context_length_error(body: Any) -> bool:
    """True for an error body saying the prompt does not fit the model's context window."""
    if not isinstance(body, dict):
        return False
    error = body.get("error")
    # Older vLLM releases put the error fields at the top level with "object": "error".
    fields = error if isinstance(error, dict) else body
    if fields.get("code") == "context_length_exceeded":
        return True
    message = fields.get("message")
    return isinstance(message, str) and _CONTEXT_LENGTH_MESSAGES.search(message) is not None
