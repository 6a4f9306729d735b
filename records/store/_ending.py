"""Ending a rollout and reading its end, wherever the captures are (docs/wire.md, "Ending a
rollout"): the readers' verbs over the contract's end files and objects."""

from __future__ import annotations

import os
from typing import Any, Optional

from ..contract import ObjectStore, is_store_url
from ._paths import directory_of
from ..contract import RolloutEnd, end_path, read_end_file, read_end_object, write_rollout_end, write_store_end
from ._store import capture_store


def end_rollout(captures: object, rollout_id: str, outcome: Optional[dict[str, Any]] = None,
                group: Optional[str] = None, group_size: Optional[int] = None) -> RolloutEnd:
    """End a rollout of a capture directory (a path or a `CaptureStore`), durably, with its
    outcome: what ``POST /-/rollouts/<rollout_id>/end`` does on a sidecar. The same end again
    returns the first; another raises `RolloutEndConflict`. On a capture store URL the end is an
    object of its own (``ends/<rollout_id>.json``), and its ``calls`` is None."""
    if isinstance(captures, str) and is_store_url(captures):
        return write_store_end(ObjectStore(captures), rollout_id, outcome, group, group_size)[0]
    directory = directory_of(capture_store(captures, "end_rollout"), "end_rollout")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"end_rollout: no capture directory at {directory}")
    return write_rollout_end(directory, rollout_id, outcome, group, group_size)[0]


def read_rollout_end(captures: object, rollout_id: str) -> Optional[RolloutEnd]:
    """The rollout's end (`RolloutEnd`), or None while it has none."""
    if isinstance(captures, str) and is_store_url(captures):
        return read_end_object(ObjectStore(captures), rollout_id)
    directory = directory_of(capture_store(captures, "read_rollout_end"), "read_rollout_end")
    return read_end_file(end_path(directory, rollout_id))
