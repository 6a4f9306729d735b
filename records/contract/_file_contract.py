"""The capture file contract (docs/files.md): file names and the layout of one capture line."""

from __future__ import annotations

import os
from typing import Any, Mapping

import orjson

from ._rollout_ids import validate_rollout_id

CAPTURE_SUFFIX = ".capture.jsonl"
INCOMPLETE_SUFFIX = ".capture.incomplete"

#: Core keys, always present and always first, in this order (NeMo Gym's files use the same).
CORE_KEYS: tuple[str, ...] = (
    "model_call_id",
    "dialect",
    "model_ref",
    "started_at",
    "completed_at",
    "latency_ms",
    "latency_ttft_ms",
    "status_code",
    "error_category",
    "request",
    "response",
)

#: Optional keys, written after the core keys in this order when present. Additive: a reader
#: ignores keys it does not know.
OPTIONAL_KEYS: tuple[str, ...] = (
    "client_session_id",
    "client_assistant_message_id",
    "client_agent_id",
    "client_parent_agent_id",
    "upstream_attempted",
    "response_source",
    "upstream_status_code",
    "local_response_reason",
    "request_raw",
    "response_raw",
    "stream_truncated",
    "failure",
)


def capture_path(capture_dir: str, rollout_id: str) -> str:
    """``<capture_dir>/<rollout_id>.capture.jsonl`` for a validated rollout id."""
    return os.path.join(capture_dir, validate_rollout_id(rollout_id) + CAPTURE_SUFFIX)


def incomplete_marker_path(capture_dir: str, rollout_id: str) -> str:
    """``<capture_dir>/<rollout_id>.capture.incomplete`` for a validated rollout id."""
    return os.path.join(capture_dir, validate_rollout_id(rollout_id) + INCOMPLETE_SUFFIX)


def encode_capture_line(fields: Mapping[str, Any], default: Any = None) -> bytes:
    """Serialise one call as a ``\\n``-terminated UTF-8 JSON line with the contract's key order.

    Core keys are always written (``None`` when unknown); optional keys only when ``fields`` has
    them; any other key is appended after them, so new fields stay additive. ``default``: what
    orjson calls for a value it cannot serialise (``str``, as NeMo Gym's ``CaptureStore.record``).
    """
    ordered: dict[str, Any] = {key: fields.get(key) for key in CORE_KEYS}
    for key in OPTIONAL_KEYS:
        if key in fields:
            ordered[key] = fields[key]
    for key, value in fields.items():
        if key not in ordered and key not in OPTIONAL_KEYS:
            ordered[key] = value
    return orjson.dumps(ordered, default=default, option=orjson.OPT_APPEND_NEWLINE)
