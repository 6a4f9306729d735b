"""`records`: the captured model calls read back (docs/reading.md). The readers' door.

Collectors and trainers import this package without the proxy: pydantic and orjson only.
Everything here takes where the captures are -- a capture directory, a `CaptureStore`, or a capture
store's URL (``segments:///path``, ``s3://...``: docs/files.md) -- or asks a `Captures` that took it
once.

Behind this door are three rooms (docs/layout.md), each with its own door:

- `records.contract`: what the sidecar's writers and every reader share (the file contract and
  its appender, the store's layout, rollout ids, ends, token entries and files, lineage), and
  beside it each audience's own door: `records.contract.writing`, `records.contract.reading`;
  `capture.journal` and `proxy.training` import only this room.
- `records.store`: a capture store read back (its view, joins, the call records).
- `records.training`: token records, trajectories, exports and the live hand-off's consumer.
"""


# The door is lazy (PEP 562): `import records.contract` -- what `capture.journal` and every writer
# import -- loads the contract room alone, not the readers behind it (a test counts the modules
# loaded: tests/project/test_structure.py). Each name is imported from its room on first use; the
# imports below are what a type checker and a reader of this file see.
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._captures import Captures
    from .contract import (
        GroupSizeConflict, RolloutEnd, RolloutEndConflict, RoutedExpertsProblem, TokenRecord, UnknownRollout,
    )
    from .contract.reading import (
        InvalidRolloutId, MalformedCaptureLine, NothingUploadedYet, RecordsError, StoreNotFound, base_url_for_run,
        rollout_id_from_run,
    )
    from .store import (
        CaptureStore,
        ModelCallRecord,
        ToolRequestEvidence,
        _as_arguments,
        _cache_signal,
        _prompt_size,
        _token_count,
        _tool_calls_and_reasoning,
        _usage_detail_token,
        aggregate_model_call_metrics,
        aggregate_model_call_records,
        attach_model_call_capture,
        build_model_call_record,
        clear_model_call_captures,
        clear_model_call_captures_for_rollouts,
        end_rollout,
        end_run,
        extract_token_stats,
        merge_model_call_capture_into_record,
        read_model_call_records,
        read_rollout_end,
        read_token_entries,
        tool_request_evidence,
    )
    from .training import (
        CallLink,
        CallSpan,
        Consumer,
        FinishedGroup,
        FinishedRollout,
        Lease,
        LeaseLost,
        Trajectory,
        TrajectoryBuild,
        iter_token_records,
        ray_dataset,
        to_atif,
        read_routed_experts,
        read_token_records,
        trajectories,
    )

__all__ = [
    # NeMo Gym 0.7.0's names, as Gym's reader and collector spell them (docs/reading.md: a drop-in).
    "ModelCallRecord",
    "ToolRequestEvidence",
    "_as_arguments",
    "_cache_signal",
    "_prompt_size",
    "_token_count",
    "_tool_calls_and_reasoning",
    "_usage_detail_token",
    "aggregate_model_call_records",
    "build_model_call_record",
    "extract_token_stats",
    "tool_request_evidence",
    "CaptureStore",
    "aggregate_model_call_metrics",
    "attach_model_call_capture",
    "base_url_for_run",
    "clear_model_call_captures",
    "clear_model_call_captures_for_rollouts",
    "merge_model_call_capture_into_record",
    "read_model_call_records",
    "read_token_entries",
    "rollout_id_from_run",
    # Where the captures are, said once.
    "Captures",
    # Training arrays and trajectories.
    "TokenRecord",
    "iter_token_records",
    "read_token_records",
    "CallLink",
    "CallSpan",
    "Trajectory",
    "TrajectoryBuild",
    "trajectories",
    "read_routed_experts",
    "ray_dataset",
    "to_atif",
    # Ending rollouts and consuming them during the run.
    "RolloutEnd",
    "end_rollout",
    "end_run",
    "read_rollout_end",
    "Consumer",
    "FinishedGroup",
    "FinishedRollout",
    "Lease",
    "LeaseLost",
    # What goes wrong, by name.
    "RecordsError",
    "InvalidRolloutId",
    "MalformedCaptureLine",
    "StoreNotFound",
    "NothingUploadedYet",
    "RolloutEndConflict",
    "UnknownRollout",
    "GroupSizeConflict",
    "RoutedExpertsProblem",
]

#: Where each name of the door lives (`__getattr__` imports it from there on first use).
_ROOMS = {
    "Captures": "._captures",
    **{name: ".contract" for name in (
        "GroupSizeConflict", "RolloutEnd", "RolloutEndConflict", "RoutedExpertsProblem", "TokenRecord",
        "UnknownRollout")},
    **{name: ".contract.reading" for name in (
        "InvalidRolloutId", "RecordsError", "MalformedCaptureLine", "NothingUploadedYet", "StoreNotFound", "base_url_for_run",
        "rollout_id_from_run")},
    **{name: ".store" for name in (
        "CaptureStore", "ModelCallRecord", "ToolRequestEvidence", "_as_arguments", "_cache_signal", "_prompt_size",
        "_token_count", "_tool_calls_and_reasoning", "_usage_detail_token", "aggregate_model_call_metrics",
        "aggregate_model_call_records", "attach_model_call_capture", "build_model_call_record",
        "clear_model_call_captures", "clear_model_call_captures_for_rollouts", "end_rollout", "end_run",
        "extract_token_stats", "merge_model_call_capture_into_record", "read_model_call_records", "read_rollout_end",
        "read_token_entries", "tool_request_evidence")},
    **{name: ".training" for name in (
        "CallLink", "CallSpan", "Consumer", "FinishedGroup", "FinishedRollout", "Lease", "LeaseLost", "Trajectory",
        "TrajectoryBuild", "iter_token_records", "ray_dataset", "to_atif", "read_routed_experts", "read_token_records",
        "trajectories")},
}
_SUBPACKAGES = frozenset({"contract", "store", "training"})


def __getattr__(name: str) -> object:
    import importlib

    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    room = _ROOMS.get(name)
    if room is None:
        raise AttributeError(f"module 'records' has no attribute {name!r}")
    value = getattr(importlib.import_module(room, __name__), name)
    globals()[name] = value  # Once: the next lookup is a plain attribute.
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _SUBPACKAGES)
