"""A capture store read back (docs/reading.md, docs/files.md): `CaptureStore` on a directory or a
store URL, the store's view as Gym's per-rollout files, the joins of its token bundles, the call
records built from its lines (Gym 0.7.0's `ModelCallRecord` and helpers) and the collector's helpers.

Imports `records.contract` only.
"""

from __future__ import annotations

from ._call_rows import CALL_COLUMNS, CallRow, call_row, invalid_arguments, with_arrow_times
from ._collect import (
    ATTACHMENT_KEY, aggregate_model_call_metrics, attach_model_call_capture, clear_model_call_captures,
    clear_model_call_captures_for_rollouts, merge_model_call_capture_into_record, read_model_call_records,
)
from ._ending import end_rollout, end_run, read_rollout_end, read_run_ended
from ._models import FailureReport, ModelCallRecord, ModelOperationObservation, ModelServerRef, ToolRequestEvidence
from ._paths import Where, directory_of
from ._record import aggregate_model_call_records, build_model_call_record, tool_request_evidence
from ._shapes import _as_arguments, _tool_calls_and_reasoning, finish_reason_of, response_shape, tool_calls_of
from ._store import CaptureStore, ReadResult, capture_store, gc_paused
from ._store_view import SegmentDamaged, SegmentRead, compact_store, plan_segment_reads, store_rollout_sizes, store_view
from ._token_file_readers import clear_token_captures, counts_from_entries, late_entries, read_token_entries
from ._tokens import _cache_signal, _prompt_size, _token_count, _usage_detail_token, extract_token_stats, usage_counts

__all__ = [
    "ATTACHMENT_KEY",
    "CALL_COLUMNS",
    "CallRow",
    "CaptureStore",
    "FailureReport",
    "ModelCallRecord",
    "ModelOperationObservation",
    "ModelServerRef",
    "ReadResult",
    "SegmentDamaged",
    "SegmentRead",
    "ToolRequestEvidence",
    "_as_arguments",
    "_cache_signal",
    "_prompt_size",
    "_token_count",
    "_tool_calls_and_reasoning",
    "_usage_detail_token",
    "aggregate_model_call_metrics",
    "aggregate_model_call_records",
    "attach_model_call_capture",
    "build_model_call_record",
    "call_row",
    "capture_store",
    "clear_model_call_captures",
    "clear_model_call_captures_for_rollouts",
    "clear_token_captures",
    "compact_store",
    "counts_from_entries",
    "Where",
    "directory_of",
    "end_rollout",
    "end_run",
    "extract_token_stats",
    "finish_reason_of",
    "gc_paused",
    "invalid_arguments",
    "late_entries",
    "merge_model_call_capture_into_record",
    "plan_segment_reads",
    "read_model_call_records",
    "read_rollout_end",
    "read_run_ended",
    "read_token_entries",
    "response_shape",
    "store_rollout_sizes",
    "store_view",
    "tool_calls_of",
    "tool_request_evidence",
    "usage_counts",
    "with_arrow_times",
]
