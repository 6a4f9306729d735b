"""Read-back API for model-call capture files: records, totals, rollout helpers.

Collectors import this package without the proxy: it depends on pydantic and orjson only
(DESIGN §1). The file contract lives here so the writer (`capture`) and readers share one truth.
Every reader takes a capture directory, a `CaptureStore`, or a capture store's URL
(``segments:///path``, ``s3://...``: DESIGN §14; object stores need fsspec and its filesystem).
"""

from ._appender import (
    append_capture_line,
    append_to_open_file,
    create_incomplete_marker,
    fsync_directory,
    open_capture_file,
)
from ._call_rows import CALL_COLUMNS, CallRow, call_row
from ._collect import (
    ATTACHMENT_KEY,
    aggregate_model_call_metrics,
    attach_model_call_capture,
    clear_model_call_captures,
    clear_model_call_captures_for_rollouts,
    merge_model_call_capture_into_record,
    read_model_call_records,
)
from ._errors import InvalidRolloutId, MalformedCaptureLine, RecordsError
from ._group_sync import GroupSync, call_syncfs, filesystem_type, load_syncfs, mount_of, syncfs_flushes
from ._fingerprints import FINGERPRINT_VERSION, assistant_fingerprint, canonical_arguments, conversation_digest
from ._lineage import LineageVerdict, RolloutLineage
from ._token_entries import (
    TOKEN_ENTRY_SCHEMA_VERSION,
    TokenEntryProblem,
    check_token_entry,
    output_items,
    request_items,
    token_digest,
    token_entry,
)
from ._weight_versions import engine_weight_versions, resolved_spans, token_versions
from ._trace_context import call_span_id, rollout_trace_id, traceparent
from ._trajectories import CallSpan, Trajectory, TrajectoryBuild, build_trajectories, trajectories
from ._token_files import TOKENS_SUFFIX, RolloutClosed, TokenFiles, clear_token_captures, late_entries, read_token_entries
from ._file_contract import (
    CAPTURE_SUFFIX,
    CORE_KEYS,
    INCOMPLETE_SUFFIX,
    OPTIONAL_KEYS,
    capture_path,
    encode_capture_line,
    incomplete_marker_path,
)
from ._models import (
    FailureReport,
    ModelCallRecord,
    ModelOperationObservation,
    ModelServerRef,
    ToolRequestEvidence,
)
from ._record import aggregate_model_call_records, build_model_call_record, tool_request_evidence
from ._rollout_ids import ROLLOUT_ID_PATTERN, is_valid_rollout_id, validate_rollout_id
from ._rollout_ends import (
    END_SUFFIX,
    RolloutEnd,
    RolloutEndConflict,
    end_request,
    end_rollout,
    is_ended,
    read_rollout_end,
    write_rollout_end,
)
from ._rollouts import (
    base_url_for_run,
    split_attempt,
    resolve_model_base_url,
    rollout_id_from_path,
    rollout_id_from_run,
    url_path_for_request,
    url_path_for_run,
)
from ._shapes import _as_arguments, _tool_calls_and_reasoning
# What a reply looks like, for the inspection tools (`mcc ls / show / stats / report`).
from ._call_rows import invalid_arguments
from ._shapes import finish_reason_of, response_shape, tool_calls_of
from ._store import gc_paused
from ._tokens import usage_counts
from ._datasets import (
    CALL_TOKEN_COLUMNS,
    KINDS,
    ROLLOUT_COLUMNS,
    TOKEN_COLUMNS,
    TRAJECTORY_COLUMNS,
    arrow_schema,
    capture_files,
    ray_dataset,
    rollout_rows_of,
    to_arrow,
    trajectory_rows,
)
from ._store import CaptureStore, ReadResult
from ._object_store import STORE_SCHEMES, ObjectStore, StoreUnavailable, is_store_url
from ._store_view import (INCOMPLETE_OBJECTS, MANIFESTS, SEGMENT_OBJECTS, TOKEN_FILE_SUFFIXES, SegmentDamaged, SegmentRead,
                          compact_store, incomplete_name, manifest_name, merge_order, merge_writers, plan_segment_reads, segment_name,
                          segment_order, store_view, token_bundle_name, token_manifest_name)
from ._token_records import (
    TOKEN_SOURCES,
    DriftTracker,
    TokenFileArrays,
    TokenRecord,
    TokenRecordFollower,
    has_token_arrays,
    names_token_entries,
    iter_token_records,
    read_token_records,
    token_records_of_line,
)
from ._tokens import _cache_signal, _prompt_size, _token_count, _usage_detail_token, extract_token_stats

__all__ = [
    # Ended rollouts (docs/reading.md, "Ending a rollout").
    "END_SUFFIX",
    "RolloutEnd",
    "RolloutEndConflict",
    "end_request",
    "end_rollout",
    "is_ended",
    "read_rollout_end",
    "write_rollout_end",
    "MANIFESTS",
    "ObjectStore",
    "SEGMENT_OBJECTS",
    "STORE_SCHEMES",
    "SegmentDamaged",
    "SegmentRead",
    "StoreUnavailable",
    "compact_store",
    "incomplete_name",
    "token_bundle_name",
    "token_manifest_name",
    "TOKEN_FILE_SUFFIXES",
    "is_store_url",
    "manifest_name",
    "merge_order",
    "merge_writers",
    "plan_segment_reads",
    "segment_name",
    "segment_order",
    "store_view",
    "finish_reason_of",
    "gc_paused",
    "invalid_arguments",
    "response_shape",
    "tool_calls_of",
    "usage_counts",
    "GroupSync",
    "call_syncfs",
    "filesystem_type",
    "mount_of",
    "load_syncfs",
    "syncfs_flushes",
    "engine_weight_versions",
    "resolved_spans",
    "token_versions",
    "call_span_id",
    "rollout_trace_id",
    "traceparent",
    "CALL_TOKEN_COLUMNS",
    "KINDS",
    "rollout_rows_of",
    "ROLLOUT_COLUMNS",
    "TRAJECTORY_COLUMNS",
    "arrow_schema",
    "to_arrow",
    "trajectory_rows",
    "clear_token_captures",
    "TokenFileArrays",
    "TokenRecordFollower",
    "names_token_entries",
    "CallSpan",
    "Trajectory",
    "TrajectoryBuild",
    "build_trajectories",
    "trajectories",
    "LineageVerdict",
    "RolloutLineage",
    "TOKEN_ENTRY_SCHEMA_VERSION",
    "TokenEntryProblem",
    "check_token_entry",
    "output_items",
    "request_items",
    "token_digest",
    "token_entry",
    "TOKENS_SUFFIX",
    "RolloutClosed",
    "TokenFiles",
    "late_entries",
    "read_token_entries",
    "CALL_COLUMNS",
    "CallRow",
    "DriftTracker",
    "ATTACHMENT_KEY",
    "CAPTURE_SUFFIX",
    "CORE_KEYS",
    "CaptureStore",
    "FINGERPRINT_VERSION",
    "FailureReport",
    "INCOMPLETE_SUFFIX",
    "InvalidRolloutId",
    "MalformedCaptureLine",
    "ModelCallRecord",
    "ModelOperationObservation",
    "ModelServerRef",
    "OPTIONAL_KEYS",
    "ROLLOUT_ID_PATTERN",
    "ReadResult",
    "TOKEN_COLUMNS",
    "TOKEN_SOURCES",
    "TokenRecord",
    "RecordsError",
    "ToolRequestEvidence",
    # The seed documents these underscore helpers as part of the module's API.
    "_as_arguments",
    "_cache_signal",
    "_prompt_size",
    "_token_count",
    "_tool_calls_and_reasoning",
    "_usage_detail_token",
    "aggregate_model_call_metrics",
    "assistant_fingerprint",
    "canonical_arguments",
    "append_capture_line",
    "append_to_open_file",
    "aggregate_model_call_records",
    "attach_model_call_capture",
    "base_url_for_run",
    "build_model_call_record",
    "call_row",
    "capture_files",
    "capture_path",
    "clear_model_call_captures",
    "conversation_digest",
    "clear_model_call_captures_for_rollouts",
    "create_incomplete_marker",
    "encode_capture_line",
    "extract_token_stats",
    "has_token_arrays",
    "fsync_directory",
    "incomplete_marker_path",
    "is_valid_rollout_id",
    "merge_model_call_capture_into_record",
    "open_capture_file",
    "iter_token_records",
    "read_model_call_records",
    "ray_dataset",
    "read_token_records",
    "token_records_of_line",
    "resolve_model_base_url",
    "rollout_id_from_path",
    "rollout_id_from_run",
    "split_attempt",
    "tool_request_evidence",
    "url_path_for_request",
    "url_path_for_run",
    "validate_rollout_id",
]
