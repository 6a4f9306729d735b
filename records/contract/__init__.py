"""What the sidecar's writers and every reader share (docs/files.md, docs/tokens.md, docs/wire.md):
the capture file contract and its durable appender, group sync, rollout ids and run URLs, the store's
object layout and merge order, ended rollouts' files and objects, the writers' watermarks, the
training-token entries and files, fingerprints and lineage, weight versions, trace ids, and what one
captured line's token arrays read as (`TokenRecord`).

This door holds only what both audiences use; each has its own door beside it:
`records.contract.writing` (what only the writers use: the appender's open files, spools' end marks,
in-flight publication, trace ids, token entries as written) and `records.contract.reading` (what only
the readers use: the store's merge, end files read back, readiness, Gym's run URLs, the errors they
raise). `capture.journal` and `proxy` import this door and the writers'; `records.store` and
`records.training` this door and the readers'. The room imports nothing else of `records`.
"""

from __future__ import annotations

from ._appender import create_incomplete_marker, fsync_directory
from ._calls_in_flight import read_in_flight
from ._file_contract import CAPTURE_SUFFIX, INCOMPLETE_SUFFIX, capture_path, encode_capture_line, incomplete_marker_path
from ._group_sync import call_syncfs, filesystem_type, load_syncfs, syncfs_flushes
from ._lineage import RolloutLineage
from ._object_store import ObjectStore
from ._rollout_ends import (
    GroupSizeConflict, RolloutEnd, RolloutEndConflict, UnknownRollout, end_object_name, read_end_object,
    wait_until_quiet, write_rollout_end, write_run_end, write_store_end, write_store_run_end,
)
from ._rollout_ids import is_valid_rollout_id
from ._routed_experts import RoutedExperts, RoutedExpertsProblem, expert_object_name
from ._store_layout import (
    TOKEN_FILE_SUFFIXES, incomplete_name, manifest_name, segment_name, segment_order, token_bundle_name,
    token_manifest_name,
)
from ._time_index import END_INDEX, INDEX_LAG_SECONDS, START_INDEX, add_to_index, index_entries_after
from ._token_entries import request_items
from ._token_files import TokenFiles
from ._token_records import TokenRecord, token_records_of_line
from ._weight_versions import resolved_spans

__all__ = [
    "CAPTURE_SUFFIX",
    "END_INDEX",
    "GroupSizeConflict",
    "INCOMPLETE_SUFFIX",
    "INDEX_LAG_SECONDS",
    "ObjectStore",
    "RolloutEnd",
    "RolloutEndConflict",
    "RolloutLineage",
    "RoutedExperts",
    "RoutedExpertsProblem",
    "START_INDEX",
    "TOKEN_FILE_SUFFIXES",
    "TokenFiles",
    "TokenRecord",
    "UnknownRollout",
    "add_to_index",
    "call_syncfs",
    "capture_path",
    "create_incomplete_marker",
    "encode_capture_line",
    "end_object_name",
    "expert_object_name",
    "filesystem_type",
    "fsync_directory",
    "incomplete_marker_path",
    "incomplete_name",
    "index_entries_after",
    "is_valid_rollout_id",
    "load_syncfs",
    "manifest_name",
    "read_end_object",
    "read_in_flight",
    "request_items",
    "resolved_spans",
    "segment_name",
    "segment_order",
    "syncfs_flushes",
    "token_bundle_name",
    "token_manifest_name",
    "token_records_of_line",
    "wait_until_quiet",
    "write_rollout_end",
    "write_run_end",
    "write_store_end",
    "write_store_run_end",
]
