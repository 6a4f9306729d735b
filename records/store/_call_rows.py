"""One call flattened into a row: what `mcc ls/show/export`, the report and `ray_dataset` share.

`call_row(rollout_id, call_index, line)` reads a capture line (docs/files.md) into a `CallRow`, whose
fields are the Parquet export's columns (`CALL_COLUMNS` gives their Arrow types), so a table, a
Parquet file and a Ray dataset of calls say the same thing about a call.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional

import orjson

from ._provenance import provenance_of
from ._shapes import describe_response
from ._tokens import arrays_counts, extract_token_stats


@dataclass
class CallRow:
    """One call, flattened for tables, reports and exports."""

    rollout_id: str
    call_index: int
    model_call_id: Optional[str]
    dialect: Optional[str]
    model: Optional[str]
    status_code: Optional[int]
    error_category: Optional[str]
    started_at: Optional[float]
    completed_at: Optional[float]
    latency_ms: Optional[float]
    ttft_ms: Optional[float]
    tokens_in: Optional[int]
    tokens_out: Optional[int]
    cached_tokens: Optional[int]
    tokens_reasoning: Optional[int]
    #: As `ModelCallRecord.finish_reason`: Anthropic ``stop_reason``, Chat ``choices[0].finish_reason``,
    #: Responses ``incomplete_details.reason`` (None for a completed Responses call).
    finish_reason: Optional[str]
    #: As `ModelCallRecord.response_status`: a Responses call's ``status`` (completed, incomplete, failed).
    response_status: Optional[str] = None
    #: As `ModelCallRecord.token_counts`: ``reported`` (the reply's usage), ``counted`` (no usage:
    #: counted from the token capture mode's arrays or entry), or None (neither).
    token_counts: Optional[str] = None
    #: The model the request asked for, and the one the reply names (OTel's request / response model).
    request_model: Optional[str] = None
    response_model: Optional[str] = None
    #: The request body was refused before it was read (a 413): nothing of it was kept.
    request_body_refused: bool = False
    tool_calls: list[str] = field(default_factory=list)
    #: Tool calls whose arguments were not valid JSON (kept as ``{"_raw": ...}``).
    invalid_tool_arguments: int = 0
    #: The stream ended without its terminal event; False for a JSON reply (never null).
    stream_truncated: bool = False
    #: Who wrote the reply: ``upstream``, or ``local`` (the sidecar itself, `local_response_reason`
    #: says why); the status the upstream sent (None when it sent none), and whether it was tried.
    response_source: Optional[str] = None
    local_response_reason: Optional[str] = None
    upstream_status_code: Optional[int] = None
    upstream_attempted: Optional[bool] = None
    #: The line's ``failure`` (docs/files.md): where it went wrong and what was said.
    failure_stage: Optional[str] = None
    failure_message: Optional[str] = None
    #: Correlation headers (docs/wire.md): evidence the client sent, not authentication.
    client_session_id: Optional[str] = None
    client_assistant_message_id: Optional[str] = None
    #: The harness's agent (Claude Code's ``x-claude-code-agent-id``) and its parent agent.
    client_agent_id: Optional[str] = None
    client_parent_agent_id: Optional[str] = None
    #: The fields the token capture mode added to the request (JSON text), None when it added none:
    #: arrays the sidecar asked for, against an agent's own (docs/tokens.md).
    added_request_fields: Optional[str] = None
    #: Prompt tokens written to the provider's cache (Anthropic ``cache_creation_input_tokens``).
    cache_creation_tokens: Optional[int] = None
    #: The request asked for a stream (``"stream": true``).
    stream: bool = False
    #: Which engine served the call (`ModelCallRecord.system_fingerprint`, ``engine``, ``engine_version``).
    system_fingerprint: Optional[str] = None
    engine: Optional[str] = None
    engine_version: Optional[str] = None
    #: Prompt tokens written to the engine's prefix cache, and multimodal prompt tokens.
    created_cache_tokens: Optional[int] = None
    multimodal_tokens: Optional[int] = None
    #: vLLM's multimodal prompt tokens by modality, and its per-request metrics, as JSON text.
    multimodal_tokens_by_modality: Optional[str] = None
    engine_metrics: Optional[str] = None
    #: The reply's answer text: filled only when asked for (``mcc export --output-text``; it is large).
    output_text: Optional[str] = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def call_row(rollout_id: str, call_index: int, line: dict[str, Any]) -> CallRow:
    response = line.get("response") if isinstance(line.get("response"), dict) else None
    request = line.get("request") if isinstance(line.get("request"), dict) else None
    facts = describe_response(response, operations=False)
    stats = extract_token_stats(response.get("usage") if response else None)
    counts = "reported" if stats["tokens_in"] is not None or stats["tokens_out"] is not None else None
    if counts is None and response is not None:  # No usage: the token mode's arrays, when the line has them.
        counted_in, counted_out = arrays_counts(response)
        if counted_in is not None or counted_out is not None:
            stats = {**stats, "tokens_in": counted_in, "tokens_out": counted_out}
            counts = "counted"
    response_model, request_model = _str((response or {}).get("model")), _str((request or {}).get("model"))
    model = response_model or request_model
    failure: dict[str, Any] = line["failure"] if isinstance(line.get("failure"), dict) else {}
    served = provenance_of(response)
    return CallRow(
        rollout_id=rollout_id, call_index=call_index, model_call_id=_str(line.get("model_call_id")),
        dialect=_str(line.get("dialect")) or facts.shape, model=_str(model), status_code=_int(line.get("status_code")),
        error_category=_str(line.get("error_category")), started_at=_num(line.get("started_at")),
        completed_at=_num(line.get("completed_at")), latency_ms=_num(line.get("latency_ms")),
        ttft_ms=_num(line.get("latency_ttft_ms")), tokens_in=stats["tokens_in"], tokens_out=stats["tokens_out"],
        token_counts=counts,
        cached_tokens=stats["cached_tokens"], tokens_reasoning=stats["tokens_reasoning"],
        finish_reason=facts.finish_reason, response_status=facts.status,
        request_model=request_model, response_model=response_model,
        request_body_refused=line.get("local_response_reason") == "body_too_large",
        tool_calls=[str(call.get("name")) for call in facts.tool_calls],
        invalid_tool_arguments=invalid_arguments(facts.tool_calls),
        stream_truncated=line.get("stream_truncated") is True,
        response_source=_str(line.get("response_source")), local_response_reason=_str(line.get("local_response_reason")),
        upstream_status_code=_int(line.get("upstream_status_code")),
        upstream_attempted=line.get("upstream_attempted") if type(line.get("upstream_attempted")) is bool else None,
        failure_stage=_str(failure.get("stage")), failure_message=_str(failure.get("message")),
        client_session_id=_str(line.get("client_session_id")),
        client_assistant_message_id=_str(line.get("client_assistant_message_id")),
        client_agent_id=_str(line.get("client_agent_id")),
        client_parent_agent_id=_str(line.get("client_parent_agent_id")),
        added_request_fields=(orjson.dumps(line["added_request_fields"]).decode()
                              if isinstance(line.get("added_request_fields"), dict) else None),
        cache_creation_tokens=stats["cache_creation_tokens"], stream=(request or {}).get("stream") is True,
        system_fingerprint=served["system_fingerprint"], engine=served["engine"], engine_version=served["engine_version"],
        created_cache_tokens=served["created_cache_tokens"], multimodal_tokens=served["multimodal_tokens"],
        multimodal_tokens_by_modality=_json(served["multimodal_tokens_by_modality"]),
        engine_metrics=_json(served["engine_metrics"]),
    )


def invalid_arguments(tool_calls: list[dict[str, Any]]) -> int:
    """Tool calls whose arguments were not JSON: `records` keeps them as ``{"_raw": text}``. A
    metrics-only line's arguments (``[REDACTED]``, docs/privacy.md) are not known to be either: not
    counted, so `mcc stats` says of a metrics-only run what it says of the same run captured whole."""
    invalid = 0
    for call in tool_calls:
        arguments = call["arguments"]
        if type(arguments) is dict and len(arguments) == 1 and "_raw" in arguments \
                and arguments["_raw"] != _CONTENT_REMOVED:
            invalid += 1
    return invalid


#: What a metrics-only line holds in place of every text (``capture.CONTENT_REMOVED``).
_CONTENT_REMOVED = "[REDACTED]"



#: The columns of a call's row, in order, with their Arrow types (the Parquet export's schema;
#: timestamps are UTC seconds in a `CallRow`, microsecond timestamps in Arrow).
CALL_COLUMNS: tuple[tuple[str, str], ...] = (
    ("rollout_id", "string"), ("call_index", "int64"), ("model_call_id", "string"), ("dialect", "string"),
    ("model", "string"), ("status_code", "int64"), ("error_category", "string"),
    ("started_at", "timestamp"), ("completed_at", "timestamp"), ("latency_ms", "float64"), ("ttft_ms", "float64"),
    ("tokens_in", "int64"), ("tokens_out", "int64"), ("cached_tokens", "int64"), ("tokens_reasoning", "int64"),
    ("token_counts", "string"), ("finish_reason", "string"), ("response_status", "string"), ("request_model", "string"),
    ("response_model", "string"), ("tool_calls", "list<string>"), ("invalid_tool_arguments", "int64"),
    ("stream_truncated", "bool"), ("response_source", "string"), ("local_response_reason", "string"),
    ("upstream_status_code", "int64"), ("upstream_attempted", "bool"), ("failure_stage", "string"),
    ("failure_message", "string"), ("client_session_id", "string"), ("client_assistant_message_id", "string"),
    ("client_agent_id", "string"), ("client_parent_agent_id", "string"),
    ("added_request_fields", "string"), ("cache_creation_tokens", "int64"), ("stream", "bool"),
    ("system_fingerprint", "string"), ("engine", "string"), ("engine_version", "string"),
    ("created_cache_tokens", "int64"), ("multimodal_tokens", "int64"), ("multimodal_tokens_by_modality", "string"),
    ("engine_metrics", "string"),
)


def with_arrow_times(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (a `CallRow` as a dict) with its UTC seconds as datetimes, which Arrow
    timestamps take; changed in place and returned."""
    for key in ("started_at", "completed_at"):
        if values.get(key) is not None:
            values[key] = datetime.fromtimestamp(values[key], tz=timezone.utc)
    return values


def _json(value: Any) -> Optional[str]:
    return None if value is None else orjson.dumps(value).decode()


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _int(value: Any) -> Optional[int]:
    return value if type(value) is int else None


def _num(value: Any) -> Optional[float]:
    return float(value) if type(value) in (int, float) else None
