"""What the sidecar's writers and every reader share (docs/files.md, docs/tokens.md, docs/wire.md):
the capture file contract and its durable appender, group sync, rollout ids and run URLs, the store's
object layout and merge order, ended rollouts' files and objects, the writers' watermarks, the
training-token entries and files, fingerprints and lineage, weight versions, trace ids, and what one
captured line's token arrays read as (`TokenRecord`).

`capture.journal` and `proxy.training` import this room only; it imports nothing else of `records`.
"""

from __future__ import annotations

from ._appender import append_capture_line, append_to_open_file, create_incomplete_marker, fsync_directory, open_capture_file
from ._errors import InvalidRolloutId, MalformedCaptureLine, NothingUploadedYet, RecordsError, StoreNotFound
from ._file_contract import (
    CAPTURE_SUFFIX, CORE_KEYS, INCOMPLETE_SUFFIX, capture_path, encode_capture_line, incomplete_marker_path,
)
from ._fingerprints import assistant_fingerprint, canonical_arguments, conversation_digest
from ._group_sync import GroupSync, call_syncfs, filesystem_type, load_syncfs, mount_of, sync_filesystem, syncfs_flushes
from ._lineage import LINE_ROOT, LineLineage, LineageVerdict, RolloutLineage
from ._object_store import ObjectStore, StoreUnavailable, is_store_url
from ._calls_in_flight import (
    IN_FLIGHT_BOUND_SECONDS, IN_FLIGHT_DIR, PUBLISH_SECONDS, SILENT_SECONDS, calls_in_flight, in_flight_readiness,
    publish_in_flight, read_in_flight, sweep_dead_publications, withdraw_in_flight,
)
from ._rollout_ends import (
    END_OBJECTS, END_SUFFIX, ROLLOUT_MARKERS, RUN_END, GroupSizeConflict, RolloutEnd, RolloutEndConflict, UnknownRollout,
    create_exclusively, end_object_name, end_path, end_request, ended_in_spool, group_of, gym_member, is_ended, mark_ended_in_spool,
    read_end_file, read_end_object, read_run_end, read_store_run_end, rollout_is_known, rollout_marker_name,
    require_store_rollout, store_rollout_is_known, wait_until_quiet,
    write_rollout_end, write_run_end, write_store_end, write_store_run_end,
)
from ._rollout_ids import is_valid_rollout_id, validate_rollout_id
from ._routed_experts import (
    EXPERT_OBJECTS, EXPERTS_SUFFIX, MISSING_ROUTE, RoutedExperts, RoutedExpertsProblem, aligned_routed_experts,
    expert_object_name, experts_path, load_routed_experts, routed_experts_reference, write_routed_experts,
)
from ._rollouts import (
    base_url_for_run, resolve_model_base_url, rollout_id_from_run, split_attempt, url_path_for_request, url_path_for_run,
)
from ._store_layout import (
    INCOMPLETE_OBJECTS, MANIFESTS, SEGMENT_OBJECTS, TOKEN_FILE_SUFFIXES, TOKEN_MANIFESTS, TOKEN_OBJECTS, incomplete_name,
    manifest_name, merge_order, merge_writers, segment_name, segment_order, token_bundle_name, token_manifest_name,
    whole_segment_lines,
)
from ._token_entries import (
    RESOLVED, ROOT, TokenEntryProblem, UNRESOLVED, check_token_entry, entry_sequence, output_items, request_items,
    token_digest, token_entry,
)
from ._token_files import RolloutClosed, TOKENS_SUFFIX, TokenFiles
from ._token_records import TokenRecord, has_token_arrays, names_token_entries, token_records_of_line
from ._time_index import (
    END_INDEX, INDEX_LAG_SECONDS, START_INDEX, add_to_index, add_to_store_index, index_entries_after, index_name,
    parse_index_name, same_stamp,
)
from ._trace_context import call_span_id, rollout_trace_id, traceparent
from ._weight_versions import (
    declared_versions, declared_versions_in_store, engine_weight_versions, note_declared_version,
    note_declared_version_in_store, resolved_spans, token_versions, version_rank,
)
from ._writer_watermarks import SEEN_SECONDS, WRITER_OBJECTS, read_watermarks, rollout_readiness, writer_object_name

__all__ = [
    "END_INDEX",
    "end_object_name",
    "INDEX_LAG_SECONDS",
    "START_INDEX",
    "add_to_index",
    "add_to_store_index",
    "index_entries_after",
    "index_name",
    "parse_index_name",
    "same_stamp",
    "IN_FLIGHT_BOUND_SECONDS",
    "IN_FLIGHT_DIR",
    "PUBLISH_SECONDS",
    "SILENT_SECONDS",
    "calls_in_flight",
    "in_flight_readiness",
    "publish_in_flight",
    "read_in_flight",
    "withdraw_in_flight",
    "sweep_dead_publications",
    "ROLLOUT_MARKERS",
    "rollout_marker_name",
    "store_rollout_is_known",
    "require_store_rollout",
    "RUN_END",
    "UnknownRollout",
    "read_run_end",
    "read_store_run_end",
    "rollout_is_known",
    "wait_until_quiet",
    "write_run_end",
    "write_store_run_end",

    "CAPTURE_SUFFIX",
    "CORE_KEYS",
    "END_OBJECTS",
    "END_SUFFIX",
    "EXPERTS_SUFFIX",
    "EXPERT_OBJECTS",
    "GroupSizeConflict",
    "GroupSync",
    "INCOMPLETE_OBJECTS",
    "INCOMPLETE_SUFFIX",
    "InvalidRolloutId",
    "LINE_ROOT",
    "LineLineage",
    "LineageVerdict",
    "MANIFESTS",
    "MISSING_ROUTE",
    "MalformedCaptureLine",
    "NothingUploadedYet",
    "ObjectStore",
    "RESOLVED",
    "ROOT",
    "RecordsError",
    "RolloutClosed",
    "RolloutEnd",
    "RolloutEndConflict",
    "RolloutLineage",
    "RoutedExperts",
    "RoutedExpertsProblem",
    "SEEN_SECONDS",
    "SEGMENT_OBJECTS",
    "StoreNotFound",
    "StoreUnavailable",
    "TOKENS_SUFFIX",
    "TOKEN_FILE_SUFFIXES",
    "TOKEN_MANIFESTS",
    "TOKEN_OBJECTS",
    "TokenEntryProblem",
    "TokenFiles",
    "TokenRecord",
    "UNRESOLVED",
    "WRITER_OBJECTS",
    "aligned_routed_experts",
    "append_capture_line",
    "append_to_open_file",
    "assistant_fingerprint",
    "base_url_for_run",
    "call_span_id",
    "call_syncfs",
    "canonical_arguments",
    "capture_path",
    "check_token_entry",
    "conversation_digest",
    "create_exclusively",
    "create_incomplete_marker",
    "declared_versions",
    "declared_versions_in_store",
    "encode_capture_line",
    "end_path",
    "end_request",
    "ended_in_spool",
    "engine_weight_versions",
    "entry_sequence",
    "expert_object_name",
    "experts_path",
    "filesystem_type",
    "fsync_directory",
    "group_of",
    "gym_member",
    "has_token_arrays",
    "incomplete_marker_path",
    "incomplete_name",
    "is_ended",
    "is_store_url",
    "is_valid_rollout_id",
    "load_routed_experts",
    "load_syncfs",
    "manifest_name",
    "mark_ended_in_spool",
    "merge_order",
    "merge_writers",
    "mount_of",
    "names_token_entries",
    "note_declared_version",
    "note_declared_version_in_store",
    "open_capture_file",
    "output_items",
    "read_end_file",
    "read_end_object",
    "read_watermarks",
    "request_items",
    "resolve_model_base_url",
    "resolved_spans",
    "rollout_id_from_run",
    "rollout_readiness",
    "rollout_trace_id",
    "routed_experts_reference",
    "segment_name",
    "segment_order",
    "split_attempt",
    "sync_filesystem",
    "syncfs_flushes",
    "token_bundle_name",
    "token_digest",
    "token_entry",
    "token_manifest_name",
    "token_records_of_line",
    "token_versions",
    "traceparent",
    "url_path_for_request",
    "url_path_for_run",
    "validate_rollout_id",
    "version_rank",
    "whole_segment_lines",
    "write_rollout_end",
    "write_routed_experts",
    "write_store_end",
    "writer_object_name",
]
