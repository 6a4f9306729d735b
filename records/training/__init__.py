"""What a trainer takes (docs/reading.md, docs/tokens.md): token records read back, their arrays and
rows, trajectories, the Arrow and Ray Data exports, and the live hand-off's `Consumer`.

Imports `records.contract` and `records.store`.
"""

from __future__ import annotations

from ._consumer import (
    Consumer, Fenced, FinishedGroup, FinishedRollout, Lease, LeaseLost, consumer_names, consumer_view,
)
from ._consumer_rooms import ExclusiveCreateBroken
from ._atif import ATIF_SCHEMA_VERSION, to_atif
from ._datasets import (
    CALL_TOKEN_COLUMNS, ROLLOUT_COLUMNS, TRAJECTORY_COLUMNS, arrow_schema, capture_files, ray_dataset, rollout_rows_of,
    to_arrow, trajectory_rows,
)
from ._routed_experts_reading import read_routed_experts
from ._token_records_reading import DriftTracker, TokenFileArrays, TokenRecordFollower, iter_token_records, read_token_records
from ._trajectories import CallLink, CallSpan, Trajectory, TrajectoryBuild, trajectories

__all__ = [
    "ATIF_SCHEMA_VERSION",
    "to_atif",
    "CALL_TOKEN_COLUMNS",
    "CallLink",
    "CallSpan",
    "Consumer",
    "Fenced",
    "DriftTracker",
    "ExclusiveCreateBroken",
    "FinishedGroup",
    "FinishedRollout",
    "Lease",
    "LeaseLost",
    "ROLLOUT_COLUMNS",
    "TRAJECTORY_COLUMNS",
    "TokenFileArrays",
    "TokenRecordFollower",
    "Trajectory",
    "TrajectoryBuild",
    "arrow_schema",
    "capture_files",
    "consumer_names",
    "consumer_view",
    "iter_token_records",
    "ray_dataset",
    "read_routed_experts",
    "read_token_records",
    "rollout_rows_of",
    "to_arrow",
    "trajectories",
    "trajectory_rows",
]
