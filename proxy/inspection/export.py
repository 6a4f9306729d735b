"""`mcc export`: captures as Parquet (one row per call) or OpenTelemetry GenAI spans (OTLP JSON).

Parquet needs pyarrow (``pip install 'model-call-capture[export]'``); DuckDB, Spark and Ray Data
read the file directly. The spans follow the OpenTelemetry GenAI semantic conventions
(``gen_ai.*`` attributes), one trace per rollout, one CLIENT span per call.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator

from records import TokenRecord

from .tables import CallRow

_PROVIDERS = {"chat": "openai", "responses": "openai", "completions": "openai", "messages": "anthropic"}


def with_token_arrays(rows: Iterable[CallRow], token_records: Iterable[TokenRecord]) -> Iterator[dict[str, Any]]:
    """One row per call and choice, with that choice's training arrays (`records.read_token_records`)."""
    by_call: dict[tuple[str, int], list[TokenRecord]] = {}
    for record in token_records:
        by_call.setdefault((record.rollout_id, record.call_index), []).append(record)
    for row in rows:
        for record in by_call.get((row.rollout_id, row.call_index)) or [None]:
            values = row.as_dict()
            values.update({name: getattr(record, name, None) for name in _TOKEN_COLUMNS})
            values["choice_index"] = record.choice_index if record is not None else 0
            values["usable"] = record.usable if record is not None else False
            values["unusable_reason"] = record.unusable_reason if record is not None else "no token arrays captured"
            values["missing"] = list(record.missing) if record is not None else None
            yield values


_TOKEN_COLUMNS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "source", "problem", "extends",
                  "drift_at")


def write_parquet(rows: Iterable[CallRow | dict[str, Any]], path: str, token_arrays: bool = False) -> int:
    """One row per call; with ``token_arrays`` (rows from `with_token_arrays`), per call and choice."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise RuntimeError("Parquet export needs pyarrow: pip install 'model-call-capture[export]'") from None
    records = [row if isinstance(row, dict) else row.as_dict() for row in rows]
    for record in records:  # Seconds since the epoch, UTC: Arrow wants datetimes (or ints) for timestamps.
        for key in ("started_at", "completed_at"):
            if record.get(key) is not None:
                record[key] = datetime.fromtimestamp(record[key], tz=timezone.utc)
    columns = [
        ("rollout_id", pa.string()), ("call_index", pa.int64()), ("model_call_id", pa.string()), ("dialect", pa.string()),
        ("model", pa.string()), ("status_code", pa.int64()), ("error_category", pa.string()),
        ("started_at", pa.timestamp("us", tz="UTC")), ("completed_at", pa.timestamp("us", tz="UTC")),
        ("latency_ms", pa.float64()), ("ttft_ms", pa.float64()), ("tokens_in", pa.int64()),
        ("tokens_out", pa.int64()), ("cached_tokens", pa.int64()), ("tokens_reasoning", pa.int64()),
        ("finish_reason", pa.string()), ("response_status", pa.string()), ("request_model", pa.string()),
        ("response_model", pa.string()),
        ("tool_calls", pa.list_(pa.string())), ("invalid_tool_arguments", pa.int64()),
        ("stream_truncated", pa.bool_()),
    ]
    if token_arrays:
        for record in records:
            record["token_source"] = record.pop("source", None)
            record["token_problem"] = record.pop("problem", None)
        columns += [("choice_index", pa.int64()), ("prompt_token_ids", pa.list_(pa.int64())),
                    ("generation_token_ids", pa.list_(pa.int64())), ("generation_log_probs", pa.list_(pa.float64())),
                    ("token_source", pa.string()), ("token_problem", pa.string()), ("missing", pa.list_(pa.string())),
                    ("usable", pa.bool_()), ("unusable_reason", pa.string()), ("extends", pa.int64()),
                    ("drift_at", pa.int64())]
    pq.write_table(pa.Table.from_pylist(records, schema=pa.schema(columns)), path)
    return len(records)


def otel_spans(rows: Iterable[CallRow]) -> dict[str, Any]:
    spans = [_span(row) for row in rows]
    return {"resourceSpans": [{
        "resource": {"attributes": [_attribute("service.name", "model-call-capture")]},
        "scopeSpans": [{"scope": {"name": "model-call-capture"}, "spans": spans}],
    }]}


def _span(row: CallRow) -> dict[str, Any]:
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": _PROVIDERS.get(row.dialect or "", row.dialect),
        "gen_ai.request.model": row.request_model,
        "gen_ai.response.model": row.response_model,
        "gen_ai.response.id": None,
        "gen_ai.usage.input_tokens": row.tokens_in,
        "gen_ai.usage.output_tokens": row.tokens_out,
        "gen_ai.usage.cache_read.input_tokens": row.cached_tokens,
        "gen_ai.usage.reasoning.output_tokens": row.tokens_reasoning,
        "gen_ai.response.finish_reasons": [row.finish_reason] if row.finish_reason else None,
        "mcc.response_status": row.response_status,
        "http.response.status_code": row.status_code,
        "error.type": row.error_category,
        "mcc.rollout_id": row.rollout_id,
        "mcc.call_index": row.call_index,
        "mcc.dialect": row.dialect,
        "mcc.ttft_ms": row.ttft_ms,
        "mcc.tool_calls": row.tool_calls or None,
    }
    start = int((row.started_at or 0) * 1e9)
    end = int((row.completed_at or row.started_at or 0) * 1e9)
    return {
        "traceId": hashlib.md5(row.rollout_id.encode()).hexdigest(),  # One trace per rollout.
        "spanId": (row.model_call_id or hashlib.md5(f"{row.rollout_id}/{row.call_index}".encode()).hexdigest())[:16],
        "name": f"chat {row.model}" if row.model else "chat",
        "kind": 3,  # SPAN_KIND_CLIENT
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": [_attribute(key, value) for key, value in attributes.items() if value is not None],
        "status": {"code": 2, "message": row.error_category} if row.error_category else {"code": 1},
    }


def _attribute(key: str, value: Any) -> dict[str, Any]:
    return {"key": key, "value": _any_value(value)}


def _any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}  # OTLP JSON encodes 64-bit ints as strings.
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    return {"stringValue": str(value)}
