"""From one capture line to a `ModelCallRecord`, and totals across records (DESIGN §7)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Iterable, Optional

from ._models import ModelCallRecord, ToolRequestEvidence
from ._shapes import (
    _tool_calls_and_reasoning,
    finish_reason_of,
    model_operations,
    response_shape,
    tool_call_ids_if_well_formed,
)
from ._tokens import extract_token_stats

#: Fields summed by `aggregate_model_call_records`; a sum over no reported value stays None.
SUMMED_FIELDS = ("tokens_in", "tokens_out", "tokens_total", "tokens_reasoning", "cached_tokens",
                 "cache_creation_tokens", "latency_total_ms")
#: Raw payload fields; attached calls leave them out (they stay in the capture files).
RAW_PAYLOAD_FIELDS = frozenset({"request", "response", "request_raw", "response_raw"})
_UNSUCCESSFUL_STATUSES = frozenset({"failed", "cancelled"})


def build_model_call_record(exchange: dict[str, Any], call_index: int) -> ModelCallRecord:
    """Map one captured exchange and its transport metadata into an observability record.

    Works on this sidecar's lines and on lines with only NeMo Gym's core keys; unknown keys are
    ignored, missing ones are None.
    """
    request = exchange.get("request") if isinstance(exchange.get("request"), dict) else None
    response = exchange.get("response") if isinstance(exchange.get("response"), dict) else None
    usage = response.get("usage") if response is not None else None
    tool_calls, reasoning = _tool_calls_and_reasoning(response) if response is not None else ([], None)
    status = response.get("status") if response is not None and response_shape(response) == "responses" else None
    fields: dict[str, Any] = {
        **extract_token_stats(usage),
        "call_index": call_index,
        "client_assistant_message_id": _text(exchange.get("client_assistant_message_id")),
        "client_session_id": _text(exchange.get("client_session_id")),
        "completed_at": _number(exchange.get("completed_at")),
        "dialect": _text(exchange.get("dialect")) or response_shape(response),
        "error_category": _text(exchange.get("error_category")),
        "failure_report": exchange.get("failure") if isinstance(exchange.get("failure"), dict) else None,
        "finish_reason": finish_reason_of(response),
        "latency_total_ms": _number(exchange.get("latency_ms")),
        "latency_ttft_ms": _number(exchange.get("latency_ttft_ms")),
        "local_response_reason": _text(exchange.get("local_response_reason")),
        "model": _text((response or {}).get("model")) or _text((request or {}).get("model")),
        "model_call_id": _text(exchange.get("model_call_id")),
        "model_operations": model_operations(response),
        "model_ref": exchange.get("model_ref") if isinstance(exchange.get("model_ref"), dict) else None,
        "reasoning_content": reasoning,
        "request": request,
        "request_raw": _text(exchange.get("request_raw")),
        "response": response,
        "response_id": _text((response or {}).get("id")),
        "response_raw": _text(exchange.get("response_raw")),
        "response_source": exchange.get("response_source") if exchange.get("response_source") in ("upstream", "local") else None,
        "response_status": _text(status),
        "started_at": _number(exchange.get("started_at")),
        "status_code": _integer(exchange.get("status_code")),
        "stream_truncated": exchange.get("stream_truncated") if isinstance(exchange.get("stream_truncated"), bool) else None,
        "tool_calls": tool_calls,
        "upstream_attempted": exchange.get("upstream_attempted") if isinstance(exchange.get("upstream_attempted"), bool) else None,
        "upstream_status_code": _integer(exchange.get("upstream_status_code")),
    }
    return ModelCallRecord.model_validate(fields)


def tool_request_evidence(response: Any, status_code: int | None = None,
                          response_status: str | None = None) -> ToolRequestEvidence:
    """Classify request evidence consistently for normalization and canonical decoding.

    omitted: no response payload was kept; unsuccessful: an error status or a failed / cancelled
    response; malformed: a payload that is not a valid response shape; available: its tool calls.
    """
    if response is None:
        return ToolRequestEvidence("omitted")
    if (status_code is not None and not 200 <= status_code < 300) or response_status in _UNSUCCESSFUL_STATUSES:
        return ToolRequestEvidence("unsuccessful")
    if not isinstance(response, dict):
        return ToolRequestEvidence("malformed")
    if response_shape(response) == "responses" and response.get("status") in _UNSUCCESSFUL_STATUSES:
        return ToolRequestEvidence("unsuccessful")
    call_ids = tool_call_ids_if_well_formed(response)
    if call_ids is None:
        return ToolRequestEvidence("malformed")
    return ToolRequestEvidence("available", call_ids)


def aggregate_model_call_records(calls: Iterable[ModelCallRecord],
                                 percentiles: Iterable[float] = ()) -> dict[str, Any]:
    """Aggregate token and latency values from model-call records.

    Sums of the values that were reported (None when none was), ``num_calls``, error-category
    counts, cache hits, tool calls; and, for each requested percentile p, ``latency_ms_p<p>`` and
    ``ttft_ms_p<p>`` (nearest-rank).
    """
    calls = list(calls)
    totals: dict[str, Any] = {"num_calls": len(calls)}
    for name in SUMMED_FIELDS:
        values = [getattr(call, name) for call in calls if getattr(call, name) is not None]
        totals[name] = sum(values) if values else None
    totals["num_cache_hits"] = sum(1 for call in calls if call.cache_hit)
    totals["num_tool_calls"] = sum(len(call.tool_calls) for call in calls)
    totals["num_errors"] = sum(1 for call in calls if call.error_category is not None)
    totals["error_categories"] = dict(Counter(call.error_category for call in calls if call.error_category))
    for p in percentiles:
        label = f"{p:g}".replace(".", "_")
        totals[f"latency_ms_p{label}"] = _percentile([c.latency_total_ms for c in calls], p)
        totals[f"ttft_ms_p{label}"] = _percentile([c.latency_ttft_ms for c in calls], p)
    return totals


def _percentile(values: list[Optional[float]], p: float) -> Optional[float]:
    present = sorted(v for v in values if v is not None)
    if not present:
        return None
    rank = max(1, math.ceil(p / 100 * len(present)))
    return present[min(rank, len(present)) - 1]


def _text(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _integer(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
