"""`mcc export`: captures as Parquet (one row per call) or OpenTelemetry GenAI spans (OTLP/JSON).

Parquet needs pyarrow; DuckDB, Spark and Ray Data read the file directly (its columns are a
table in the README). The spans follow the OpenTelemetry GenAI semantic conventions (``gen_ai.*``
attributes): one trace per rollout, its root span the rollout and one CLIENT span per call under
it, written as NDJSON with one OTLP ``ExportTraceServiceRequest`` per line, which a collector's
``/v1/traces`` takes as it is.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Iterable, Iterator, Optional

import orjson

from records.store import CALL_COLUMNS
from records.training import CALL_TOKEN_COLUMNS, ROLLOUT_COLUMNS, arrow_schema, to_arrow
from records.contract.reading import call_span_id, rollout_trace_id

from .tables import CallRow

_PROVIDERS = {"chat": "openai", "responses": "openai", "completions": "openai", "messages": "anthropic"}


#: Said when pyarrow is missing: the package is not on PyPI, so name what works from a clone too.
PYARROW_HINT = ("Parquet export needs pyarrow: pip install pyarrow (in the environment mcc runs from; "
                "from a clone, make install or .venv/bin/pip install pyarrow)")


def write_parquet(rows: list[dict[str, Any]], path: str, kind: str = "calls", output_text: bool = False,
                  metadata: dict[bytes, bytes] | None = None) -> int:
    """``rows`` (`records.training.rollout_rows_of` of ``kind``: ``calls``, or ``call_tokens`` with the
    training arrays) in one Parquet file with that kind's columns (the ``--ray`` export's), plus
    ``output_text`` when asked; ``metadata`` in the file's key-value metadata."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise RuntimeError(PYARROW_HINT) from None
    columns = list(CALL_TOKEN_COLUMNS if kind == "call_tokens" else CALL_COLUMNS)
    if output_text:
        columns.append(("output_text", "string"))
    columns += list(ROLLOUT_COLUMNS)
    schema = arrow_schema(columns).with_metadata(metadata or {})
    pq.write_table(to_arrow({name: [row.get(name) for row in rows] for name, _ in columns}, schema), path)
    return len(rows)


def tool_version_string() -> str:
    """This package's installed version, or ``unknown`` when run from a checkout not installed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("model-call-capture")
    except PackageNotFoundError:
        return "unknown"


def export_metadata(directory: str, context: Any) -> dict[bytes, bytes]:
    """What every exported Parquet file says of itself: the tool and its version, the directory it
    read, when, and the command's arguments."""
    from datetime import datetime, timezone
    tool_version = tool_version_string()
    arguments = {key: value for key, value in (context.params if context is not None else {}).items()}
    return {b"model_call_capture.version": tool_version.encode(),
            b"model_call_capture.source_directory": os.path.abspath(directory).encode(),
            b"model_call_capture.exported_at": datetime.now(timezone.utc).isoformat().encode(),
            b"model_call_capture.arguments": orjson.dumps(arguments, default=str)}


#: Spans per OTLP request line: a collector's request size stays bounded however long a rollout is.
SPANS_PER_LINE = 1000


#: The cache-write count's name in the GenAI conventions (semantic-conventions-genai, span
#: ``gen_ai.client.inference``), and the name it had before, which the ``opentelemetry-semantic-
#: conventions`` Python package still exports (``GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS``):
#: ``compat`` writes both, for dashboards built on the package's constants.
CACHE_WRITE = "gen_ai.usage.cache_write.input_tokens"
CACHE_WRITE_BEFORE = "gen_ai.usage.cache_creation.input_tokens"


def otel_lines(rollouts: Iterable[tuple[str, list[CallRow]]], spans_per_line: int = SPANS_PER_LINE,
               compat: bool = False) -> Iterator[bytes]:
    """OTLP/JSON, one ``ExportTraceServiceRequest`` per line (NDJSON): each rollout a trace whose
    root span (the rollout) has its calls as children, a rollout over ``spans_per_line`` calls
    continuing on the next lines. Each line can be POSTed as it is to a collector's ``/v1/traces``.
    The trace and each call's span have the ids the sidecar sent upstream in ``traceparent``
    (`records.contract.traceparent`), so the upstream's own spans of a call sit under its span."""
    for rollout_id, rows in rollouts:
        trace_id = rollout_trace_id(rollout_id)  # One trace per rollout, the same every export.
        root_id = _span_id(f"rollout/{rollout_id}")
        spans = [_rollout_span(rollout_id, rows, trace_id, root_id)]
        spans.extend(_call_span(row, trace_id, root_id, compat) for row in rows)
        for first in range(0, len(spans), spans_per_line):
            yield orjson.dumps(_export_request(spans[first:first + spans_per_line]), option=orjson.OPT_APPEND_NEWLINE)


def _export_request(spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {"resourceSpans": [{
        "resource": {"attributes": [_attribute("service.name", "model-call-capture")]},
        "scopeSpans": [{"scope": {"name": "model-call-capture"}, "spans": spans}],
    }]}


def _span_id(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()[:16]


def _nanos(seconds: Optional[float]) -> str:
    return str(int((seconds or 0) * 1e9))  # OTLP/JSON writes 64-bit integers as strings.


def _rollout_span(rollout_id: str, rows: list[CallRow], trace_id: str, span_id: str) -> dict[str, Any]:
    """The rollout as the trace's root: from its first call's start to its last call's end."""
    starts = [row.started_at for row in rows if row.started_at is not None]
    ends = [end for end in (row.completed_at or row.started_at for row in rows) if end is not None]
    errors = sum(1 for row in rows if row.error_category)
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": rollout_id,
                  "mcc.rollout_id": rollout_id, "mcc.calls": len(rows), "mcc.errors": errors}
    return {
        "traceId": trace_id, "spanId": span_id, "name": f"rollout {rollout_id}", "kind": 1,  # SPAN_KIND_INTERNAL
        "startTimeUnixNano": _nanos(min(starts) if starts else None), "endTimeUnixNano": _nanos(max(ends) if ends else None),
        "attributes": _attributes(attributes),
        "status": {"code": 2, "message": f"{errors} of {len(rows)} calls failed"} if errors else {"code": 1},
    }


_OPERATIONS = {"completions": "text_completion"}


def _call_span(row: CallRow, trace_id: str, parent_id: str, compat: bool = False) -> dict[str, Any]:
    """The call as a ``gen_ai.client.inference`` span (semantic-conventions-genai, client-inference.md)."""
    operation = _OPERATIONS.get(row.dialect or "", "chat")
    attributes = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": _PROVIDERS.get(row.dialect or "", row.dialect),
        "gen_ai.conversation.id": row.rollout_id,
        "gen_ai.request.model": row.request_model,
        "gen_ai.response.model": row.response_model,
        "gen_ai.usage.input_tokens": row.tokens_in,
        "gen_ai.usage.output_tokens": row.tokens_out,
        "gen_ai.usage.cache_read.input_tokens": row.cached_tokens,
        CACHE_WRITE: row.cache_creation_tokens,
        CACHE_WRITE_BEFORE: row.cache_creation_tokens if compat else None,
        "gen_ai.usage.reasoning.output_tokens": row.tokens_reasoning,
        "gen_ai.response.finish_reasons": [row.finish_reason] if row.finish_reason else None,
        "gen_ai.request.stream": row.stream or None,
        # Seconds from the request to the first chunk: the sidecar's TTFT is the upstream's first token.
        "gen_ai.response.time_to_first_chunk": row.ttft_ms / 1000 if row.stream and row.ttft_ms is not None else None,
        "http.response.status_code": row.status_code,
        "error.type": row.error_category,
        "mcc.rollout_id": row.rollout_id,
        "mcc.call_index": row.call_index,
        "mcc.model_call_id": row.model_call_id,
        "mcc.dialect": row.dialect,
        "mcc.response_status": row.response_status,
        "mcc.response_source": row.response_source,
        "mcc.local_response_reason": row.local_response_reason,
        "mcc.ttft_ms": row.ttft_ms,
        "mcc.stream_truncated": row.stream_truncated,
        "mcc.tool_calls": row.tool_calls or None,
    }
    model = row.request_model or row.model
    return {
        "traceId": trace_id,
        "spanId": call_span_id(row.model_call_id, row.rollout_id, row.call_index),
        "parentSpanId": parent_id,
        "name": f"{operation} {model}" if model else operation,
        "kind": 3,  # SPAN_KIND_CLIENT
        "startTimeUnixNano": _nanos(row.started_at),
        "endTimeUnixNano": _nanos(row.completed_at or row.started_at),
        "attributes": _attributes(attributes),
        "status": {"code": 2, "message": row.failure_message or row.error_category} if row.error_category else {"code": 1},
    }


def _attributes(values: dict[str, Any]) -> list[dict[str, Any]]:
    return [_attribute(key, value) for key, value in values.items() if value is not None]


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
