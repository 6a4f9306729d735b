"""Ending a rollout and reading its end, wherever the captures are (docs/wire.md, "Ending a
rollout"): the readers' verbs over the contract's end files and objects."""

from __future__ import annotations

import os
from typing import Any, Optional

from ..contract import ObjectStore
from ..contract.reading import is_store_url
from ._paths import directory_of
from ..contract import (
    RolloutEnd, read_end_object, wait_until_quiet, write_rollout_end, write_run_end, write_store_end,
    write_store_run_end,
)
from ..contract.reading import end_path, read_end_file, read_run_end, read_store_run_end
from ._store import capture_store

#: How long `end_rollout` waits for the rollout's calls in flight (as the sidecar's end does).
END_WAITS_SECONDS = 30.0


def end_rollout(captures: object, rollout_id: str, outcome: Optional[dict[str, Any]] = None,
                group: Optional[str] = None, group_size: Optional[int] = None, *, allow_empty: bool = False,
                wait_seconds: float = END_WAITS_SECONDS) -> RolloutEnd:
    """End a rollout of a capture directory (a path or a `CaptureStore`), durably, with its
    outcome: what ``POST /-/rollouts/<rollout_id>/end`` does on a sidecar. The same end again
    returns the first; another raises `RolloutEndConflict`. On a capture store URL the end is an
    object of its own (``ends/<rollout_id>.json``), and its ``calls`` is None.

    As the sidecar's end, it first waits (at most ``wait_seconds``) until no sidecar of the
    directory has a call of the rollout in flight, so the calls made before the end are whole in
    it; a rollout with no trace (no capture, no call in flight, no token files) is refused with
    `UnknownRollout` unless ``allow_empty``."""
    if isinstance(captures, str) and is_store_url(captures):
        return write_store_end(ObjectStore(captures), rollout_id, outcome, group, group_size,
                               allow_empty=allow_empty)[0]
    directory = directory_of(capture_store(captures, "end_rollout"), "end_rollout")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"end_rollout: no capture directory at {directory}")
    wait_until_quiet(directory, rollout_id, wait_seconds)
    return write_rollout_end(directory, rollout_id, outcome, group, group_size, allow_empty=allow_empty)[0]


def end_run(captures: object, info: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Say the run is over (every rollout of it ended): a consumer's `records.Consumer.batches`
    loop ends once it has taken everything, and a short group is handed out partial at once.
    Durable when it returns; a second end returns the first. ``info``: any JSON object."""
    if isinstance(captures, str) and is_store_url(captures):
        return write_store_run_end(ObjectStore(captures), info)
    directory = directory_of(capture_store(captures, "end_run"), "end_run")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"end_run: no capture directory at {directory}")
    return write_run_end(directory, info)


def read_run_ended(captures: object) -> Optional[dict[str, Any]]:
    """The run's end (``ended_at``, ``info``), or None while the run goes on."""
    if isinstance(captures, str) and is_store_url(captures):
        return read_store_run_end(ObjectStore(captures))
    return read_run_end(directory_of(capture_store(captures, "read_run_ended"), "read_run_ended"))


def read_rollout_end(captures: object, rollout_id: str) -> Optional[RolloutEnd]:
    """The rollout's end (`RolloutEnd`), or None while it has none."""
    if isinstance(captures, str) and is_store_url(captures):
        return read_end_object(ObjectStore(captures), rollout_id)
    directory = directory_of(capture_store(captures, "read_rollout_end"), "read_rollout_end")
    return read_end_file(end_path(directory, rollout_id))
