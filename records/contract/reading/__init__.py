"""What only the readers use of the contract (`records.store`, `records.training`): the store's
layout and merge order, ends and the run's end read back, the writers' watermarks and readiness,
the calls in flight read, Gym's run URLs, token entries checked, routed experts aligned, declared
weight versions, and the errors readers raise. What writers use too is `records.contract`'s.
"""

from __future__ import annotations

from .._appender import append_capture_line
from .._calls_in_flight import IN_FLIGHT_BOUND_SECONDS, calls_in_flight, in_flight_readiness
from .._errors import InvalidRolloutId, MalformedCaptureLine, NothingUploadedYet, RecordsError, StoreNotFound
from .._file_contract import CORE_KEYS
from .._fingerprints import assistant_fingerprint, canonical_arguments, conversation_digest
from .._group_sync import sync_filesystem
from .._lineage import LINE_ROOT, LineLineage
from .._object_store import StoreUnavailable, is_store_url
from .._rollout_ends import (
    END_OBJECTS, END_SUFFIX, ROLLOUT_MARKERS, RUN_END, create_exclusively, end_path, group_of, gym_member,
    read_end_file, read_run_end, read_store_run_end, rollout_is_known, store_rollout_is_known,
)
from .._rollout_ids import validate_rollout_id
from .._rollouts import (
    base_url_for_run, resolve_model_base_url, rollout_id_from_run, split_attempt, url_path_for_request,
    url_path_for_run,
)
from .._routed_experts import (
    EXPERT_OBJECTS, MISSING_ROUTE, aligned_routed_experts, experts_path, load_routed_experts, routed_experts_reference,
)
from .._store_layout import (
    INCOMPLETE_OBJECTS, MANIFESTS, SEGMENT_OBJECTS, TOKEN_MANIFESTS, TOKEN_OBJECTS, merge_order, merge_writers,
    whole_segment_lines,
)
from .._time_index import parse_index_name, same_stamp
from .._token_entries import (
    RESOLVED, ROOT, TokenEntryProblem, UNRESOLVED, check_token_entry, entry_sequence, token_digest,
)
from .._token_files import TOKENS_SUFFIX
from .._token_records import has_token_arrays, names_token_entries
from .._trace_context import call_span_id, rollout_trace_id
from .._weight_versions import declared_versions, declared_versions_in_store, token_versions, version_rank
from .._writer_watermarks import WRITER_OBJECTS, read_watermarks, rollout_readiness

__all__ = [
    "CORE_KEYS",
    "END_OBJECTS",
    "END_SUFFIX",
    "EXPERT_OBJECTS",
    "INCOMPLETE_OBJECTS",
    "IN_FLIGHT_BOUND_SECONDS",
    "InvalidRolloutId",
    "LINE_ROOT",
    "LineLineage",
    "MANIFESTS",
    "MISSING_ROUTE",
    "MalformedCaptureLine",
    "NothingUploadedYet",
    "RESOLVED",
    "ROLLOUT_MARKERS",
    "ROOT",
    "RUN_END",
    "RecordsError",
    "SEGMENT_OBJECTS",
    "StoreNotFound",
    "StoreUnavailable",
    "TOKENS_SUFFIX",
    "TOKEN_MANIFESTS",
    "TOKEN_OBJECTS",
    "TokenEntryProblem",
    "UNRESOLVED",
    "WRITER_OBJECTS",
    "aligned_routed_experts",
    "append_capture_line",
    "assistant_fingerprint",
    "base_url_for_run",
    "call_span_id",
    "calls_in_flight",
    "canonical_arguments",
    "check_token_entry",
    "conversation_digest",
    "create_exclusively",
    "declared_versions",
    "declared_versions_in_store",
    "end_path",
    "entry_sequence",
    "experts_path",
    "group_of",
    "gym_member",
    "has_token_arrays",
    "in_flight_readiness",
    "is_store_url",
    "load_routed_experts",
    "merge_order",
    "merge_writers",
    "names_token_entries",
    "parse_index_name",
    "read_end_file",
    "read_run_end",
    "read_store_run_end",
    "read_watermarks",
    "resolve_model_base_url",
    "rollout_id_from_run",
    "rollout_is_known",
    "rollout_readiness",
    "rollout_trace_id",
    "routed_experts_reference",
    "same_stamp",
    "split_attempt",
    "store_rollout_is_known",
    "sync_filesystem",
    "token_digest",
    "token_versions",
    "url_path_for_request",
    "url_path_for_run",
    "validate_rollout_id",
    "version_rank",
    "whole_segment_lines",
]
