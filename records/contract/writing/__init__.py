"""What only the sidecar's writers use of the contract (`capture.journal`, `proxy`): the durable
appender's open files, an end's request and the spool's marks of ends, the calls in flight
published, the store's writer objects and index entries, token entries as written, routed experts
written, trace ids, weight versions noted. What readers use too is `records.contract`'s.
"""

from __future__ import annotations

from .._appender import append_to_open_file, open_capture_file
from .._calls_in_flight import (
    IN_FLIGHT_DIR, PUBLISH_SECONDS, SILENT_SECONDS, publish_in_flight, sweep_dead_publications, withdraw_in_flight,
)
from .._group_sync import GroupSync, mount_of
from .._lineage import LineageVerdict
from .._object_store import STORE_SCHEMES
from .._rollout_ends import (
    end_lookup, end_request, ended_in_spool, is_ended, mark_ended_in_spool, require_store_rollout, rollout_marker_name,
)
from .._routed_experts import EXPERTS_SUFFIX, write_routed_experts
from .._time_index import add_to_store_index, index_name
from .._token_entries import output_items, token_entry
from .._token_files import RolloutClosed
from .._trace_context import traceparent
from .._weight_versions import engine_weight_versions, note_declared_version, note_declared_version_in_store
from .._writer_watermarks import SEEN_SECONDS, writer_object_name

__all__ = [
    "EXPERTS_SUFFIX",
    "STORE_SCHEMES",
    "GroupSync",
    "IN_FLIGHT_DIR",
    "LineageVerdict",
    "PUBLISH_SECONDS",
    "RolloutClosed",
    "SEEN_SECONDS",
    "SILENT_SECONDS",
    "add_to_store_index",
    "append_to_open_file",
    "end_request",
    "end_lookup",
    "ended_in_spool",
    "engine_weight_versions",
    "index_name",
    "is_ended",
    "mark_ended_in_spool",
    "mount_of",
    "note_declared_version",
    "note_declared_version_in_store",
    "open_capture_file",
    "output_items",
    "publish_in_flight",
    "require_store_rollout",
    "rollout_marker_name",
    "sweep_dead_publications",
    "token_entry",
    "traceparent",
    "withdraw_in_flight",
    "write_routed_experts",
    "writer_object_name",
]
