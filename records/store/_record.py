"""From one capture line to a `ModelCallRecord`, and totals across records (docs/records.md)."""

from __future__ import annotations

import math
import sys
from collections import Counter
from typing import Any, Iterable, Optional

from pydantic import ValidationError

from ._models import (
    FailureReport,
    ModelCallRecord,
    ModelServerRef,
    ToolRequestEvidence,
    all_fields_set,
    construct_checked,
)
from ._provenance import PROVENANCE_FIELDS, provenance_of
from ._shapes import describe_response, response_shape, tool_call_ids_if_well_formed
from ._tokens import arrays_counts, extract_token_stats

#: Raw payload fields; attached calls leave them out (they stay in the capture files).
RAW_PAYLOAD_FIELDS = frozenset({"request", "response", "request_raw", "response_raw"})
#: Record fields NeMo Gym 0.7.0's record does not have (the seed's newer ones, and ours): an
#: attached call leaves them out unless asked (``extended=True``), so it has Gym's shape.
EXTENDED_CALL_FIELDS = frozenset({"client_agent_id", "client_assistant_message_id", "client_parent_agent_id",
                                  "failure_report", "model_operations", "side_call", "stream_truncated", "token_counts",
                                  *PROVENANCE_FIELDS})
_UNSUCCESSFUL_STATUSES = frozenset({"failed", "cancelled"})


def build_model_call_record(exchange: dict[str, Any], call_index: int) -> ModelCallRecord:
    """Map one captured exchange and its transport metadata into an observability record.

    Works on this sidecar's lines and on lines with only NeMo Gym's core keys; unknown keys are
    ignored, missing or mistyped ones are None. Collectors build hundreds of thousands of these,
    so every value is type-checked inline (``type(v) is str``) rather than through helpers.
    """
    get = exchange.get
    request = get("request")
    if type(request) is not dict:
        request = None
    response = get("response")
    if type(response) is not dict:
        response = None
    facts = describe_response(response)
    tokens = extract_token_stats(response.get("usage") if response is not None else None)
    counts = "reported" if tokens["tokens_in"] is not None or tokens["tokens_out"] is not None else None
    if counts is None and response is not None:  # No usage: the token mode's arrays, when the line has them.
        counted_in, counted_out = arrays_counts(response)
        if counted_in is not None or counted_out is not None:
            tokens = {**tokens, "tokens_in": counted_in, "tokens_out": counted_out,
                      "tokens_total": counted_in + counted_out if counted_in is not None and counted_out is not None
                      else None}
            counts = "counted"
    model = response.get("model") if response is not None else None
    if type(model) is not str:
        model = request.get("model") if request is not None else None
    response_id = response.get("id") if response is not None else None
    source = get("response_source")
    started: Any = get("started_at")  # Any: each is checked inline below (``type(v) in _NUMBERS``).
    completed: Any = get("completed_at")
    latency: Any = get("latency_ms")
    ttft: Any = get("latency_ttft_ms")
    failure = get("failure")
    served = provenance_of(response)
    fields = {
        "cache_creation_tokens": tokens["cache_creation_tokens"],
        "cache_hit": tokens["cache_hit"],
        "cached_tokens": tokens["cached_tokens"],
        "call_index": call_index,
        "client_agent_id": v if type(v := get("client_agent_id")) is str else None,
        "client_assistant_message_id": v if type(v := get("client_assistant_message_id")) is str else None,
        "client_parent_agent_id": v if type(v := get("client_parent_agent_id")) is str else None,
        "client_session_id": v if type(v := get("client_session_id")) is str else None,
        "completed_at": float(completed) if type(completed) in _NUMBERS else None,
        "created_cache_tokens": served["created_cache_tokens"],
        "dialect": v if type(v := get("dialect")) is str else facts.shape,
        "engine": served["engine"],
        "engine_metrics": served["engine_metrics"],
        "engine_version": served["engine_version"],
        "error_category": v if type(v := get("error_category")) is str else None,
        "failure_report": _nested(FailureReport, failure) if failure is not None else None,
        "finish_reason": facts.finish_reason,
        "latency_total_ms": float(latency) if type(latency) in _NUMBERS else None,
        "latency_ttft_ms": float(ttft) if type(ttft) in _NUMBERS else None,
        "local_response_reason": v if type(v := get("local_response_reason")) is str else None,
        "model": model if type(model) is str else None,
        "model_call_id": v if type(v := get("model_call_id")) is str else None,
        "model_operations": facts.operations,
        "model_ref": _model_ref(get("model_ref")),
        "multimodal_tokens": served["multimodal_tokens"],
        "multimodal_tokens_by_modality": served["multimodal_tokens_by_modality"],
        "reasoning_content": facts.reasoning,
        "request": request,
        "request_raw": v if type(v := get("request_raw")) is str else None,
        "response": response,
        "response_id": response_id if type(response_id) is str else None,
        "response_raw": v if type(v := get("response_raw")) is str else None,
        "response_source": source if source == "upstream" or source == "local" else None,
        "response_status": facts.status,
        "side_call": _side_call(get("side_call")),
        "started_at": float(started) if type(started) in _NUMBERS else None,
        "status_code": _status_code(get("status_code")),
        "stream_truncated": v if type(v := get("stream_truncated")) is bool else None,
        "system_fingerprint": served["system_fingerprint"],
        "token_counts": counts,
        "tokens_in": tokens["tokens_in"],
        "tokens_out": tokens["tokens_out"],
        "tokens_reasoning": tokens["tokens_reasoning"],
        "tokens_total": tokens["tokens_total"],
        "tool_calls": facts.tool_calls or [],  # A fresh list: `_NO_FACTS` holds one shared empty one.
        "upstream_attempted": v if type(v := get("upstream_attempted")) is bool else None,
        "upstream_status_code": _status_code(get("upstream_status_code")),
    }
    # Every value above went through a type check of its own (see `construct_checked`).
    return construct_checked(ModelCallRecord, fields, _RECORD_FIELDS)


_RECORD_FIELDS = all_fields_set(ModelCallRecord)


def fill_counts_from_entries(records: list[ModelCallRecord], counts: dict[str, tuple[int, int]]) -> None:
    """Where usage was missing, the counts the calls' training-token entries give
    (`records.store.counts_from_entries`): marked ``counted``."""
    for record in records:
        if record.token_counts == "reported" or (record.tokens_in is not None and record.tokens_out is not None):
            continue
        counted = counts.get(record.model_call_id or "")
        if counted is None:
            continue
        record.tokens_in = record.tokens_in if record.tokens_in is not None else counted[0]
        record.tokens_out = record.tokens_out if record.tokens_out is not None else counted[1]
        record.tokens_total = record.tokens_in + record.tokens_out
        record.token_counts = "counted"
#: JSON numbers for times and durations: not bools (``type(True) is bool``, not int).
_NUMBERS = (int, float)
_MODEL_REFS: dict[tuple[Any, Any], ModelServerRef] = {}


def _status_code(value: Any) -> Optional[int]:
    """An HTTP status as an int; a numeric string (``"200"``) or a whole float is read as one, as
    pydantic's lax mode reads it for NeMo Gym; anything else (bools included) is None."""
    if type(value) is int:
        return value
    if type(value) is str and value.strip().isascii() and value.strip().isdigit():
        return int(value)
    if type(value) is float and value.is_integer():
        return int(value)
    return None


def _model_ref(value: Any) -> Optional[ModelServerRef]:
    """The line's ``model_ref``; the few distinct ones of a run are validated once and shared
    (`ModelServerRef` is frozen, so sharing is safe)."""
    if type(value) is not dict:
        return None
    if len(value) == 2 and "type" in value and "name" in value:
        key = (value["type"], value["name"])
        if type(key[0]) is str and (key[1] is None or type(key[1]) is str):
            cached = _MODEL_REFS.get(key)
            if cached is None and len(_MODEL_REFS) < 1024:
                cached = _MODEL_REFS[key] = ModelServerRef(type=key[0], name=key[1])
            if cached is not None:
                return cached
    return _nested(ModelServerRef, value)


def _nested(model: type[Any], value: Any) -> Any:
    """A small nested object validated the ordinary way; None when absent or not of its shape."""
    if not isinstance(value, dict):
        return None
    try:
        return model.model_validate(value)
    except ValidationError:
        return None


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


#: NeMo Gym 0.7.0's metrics, in its order: what `aggregate_model_call_records` returns by default,
#: so a row attached by us and one attached by Gym have one shape (issue 23).
GYM_METRICS = ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_total", "cached_tokens", "latency_total_ms",
               "num_calls")


def aggregate_model_call_records(calls: Iterable[ModelCallRecord], percentiles: Iterable[float] = (), *,
                                 extended: bool = False) -> dict[str, Any]:
    """Aggregate token and latency values from model-call records.

    By default exactly NeMo Gym 0.7.0's keys (`GYM_METRICS`): sums of the values that were
    reported (None when none was) and ``num_calls``. ``extended=True`` adds
    ``cache_creation_tokens``, ``num_cache_hits``, ``num_tool_calls``, ``num_errors`` and
    ``error_categories``; each requested percentile p adds ``latency_ms_p<p>`` and ``ttft_ms_p<p>``
    (nearest-rank). Additions are asked for, never implied, so Gym's consumers see Gym's shape.
    """
    calls = list(calls)
    totals: dict[str, Any] = {}
    for name in GYM_METRICS[:-1] + (("cache_creation_tokens",) if extended else ()):
        values = [getattr(call, name) for call in calls if getattr(call, name) is not None]
        totals[name] = gym_sum(values) if values else None
    totals["num_calls"] = len(calls)
    if extended:
        totals["num_cache_hits"] = sum(1 for call in calls if call.cache_hit)
        totals["num_tool_calls"] = sum(len(call.tool_calls) for call in calls)
        totals["num_errors"] = sum(1 for call in calls if call.error_category is not None)
        totals["error_categories"] = dict(Counter(call.error_category for call in calls if call.error_category))
    for p in percentiles:
        label = f"{p:g}".replace(".", "_")
        totals[f"latency_ms_p{label}"] = _percentile([c.latency_total_ms for c in calls], p)
        totals[f"ttft_ms_p{label}"] = _percentile([c.latency_ttft_ms for c in calls], p)
    return totals


def gym_sum(values: list[Any]) -> Any:
    """``sum(values)`` as Gym 0.7.0 gets it on the Python it runs on (3.12+): floats added with
    Neumaier's compensation, as CPython's ``sum`` does since 3.12. A plain sum on 3.10 and 3.11
    differs from it in the last bit for some latencies (1.102 against 1.1019999999999999)."""
    if sys.version_info >= (3, 12) or all(type(value) is int for value in values):
        return sum(values)
    total = compensation = 0.0
    for value in values:
        value = float(value)
        added = total + value
        if abs(total) >= abs(value):
            compensation += (total - added) + value
        else:
            compensation += (value - added) + total
        total = added
    return total + compensation if compensation and math.isfinite(compensation) else total


def _percentile(values: list[Optional[float]], p: float) -> Optional[float]:
    present = sorted(v for v in values if v is not None)
    if not present:
        return None
    rank = max(1, math.ceil(p / 100 * len(present)))
    return present[min(rank, len(present)) - 1]


def _side_call(marked: Any) -> Optional[str]:
    """The reason a line was marked a side call (``side_call: {"reason": ...}``), else None."""
    reason = marked.get("reason") if type(marked) is dict else None
    return reason if type(reason) is str else None
