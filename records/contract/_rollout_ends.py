"""Ended rollouts: the durable fact that a rollout is finished, with its outcome (docs/wire.md,
"Ending a rollout").

An end is a file of its own beside the rollout's: ``<rollout_id>.end.json``, one JSON object
(`RolloutEnd`), created once and never rewritten. ``<rollout_id>.capture.jsonl`` does not change
shape, so NeMo Gym's readers read an ended rollout as before. The end is created exclusively
(written whole to a temporary file, fsynced, then linked to its name, which fails when the name
exists: two sidecars ending one rollout at once cannot both win) and the directory fsynced, so it
is durable when `write_rollout_end` returns. Ending again with the same outcome, group and size is
the first end again; anything else is `RolloutEndConflict`, and nothing changes.

An end is also Gym's freeze: where the rollout has training-token files, their state is frozen
first (`TokenFiles.freeze`), so no entry is taken after the end; the sidecar answers a later call
for the rollout with 409.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import time
from typing import Any, Optional

import orjson
from pydantic import BaseModel, ConfigDict

from ._file_contract import capture_path
from ._object_store import ObjectStore, create_file_exclusively
from ._rollout_ids import validate_rollout_id

END_SUFFIX = ".end.json"
#: In a capture store: ``ends/<rollout_id>.json``, an object of its own, written at once (not at the
#: next segment seal), created with a conditional put; and ``groups/<digest>.json``, a group's size.
END_OBJECTS, GROUP_OBJECTS = "ends", "groups"


def end_object_name(rollout_id: str) -> str:
    return f"{END_OBJECTS}/{validate_rollout_id(rollout_id)}.json"


class RolloutEnd(BaseModel):
    """A rollout's end: when, with what outcome, in which group, and how many calls it had."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    rollout_id: str
    #: UTC Unix seconds the end was written.
    ended_at: float
    #: Any JSON object the runner gave (reward, metrics), or None.
    outcome: Optional[dict[str, Any]] = None
    #: The group key given at the end, or None.
    group: Optional[str] = None
    #: The group's size declared at the end, or None.
    group_size: Optional[int] = None
    #: Whole capture lines the rollout had when it ended; None on a capture store, where lines
    #: reach the store on their own (a consumer waits for all of them: docs/reading.md).
    calls: Optional[int] = 0


#: Gym's rollout ids: ``<task>-<rollout>[-a<attempt>]``.
_GYM_ID = re.compile(r"^(.+)-(\d+)(?:-a(\d+))?$")


def group_of(rollout_id: str, group: Optional[str]) -> Optional[str]:
    """A rollout's group key: the ``group`` given at its end, else the task of Gym's
    ``<task>-<rollout>[-a<n>]`` id, else None."""
    if group is not None:
        return group
    match = _GYM_ID.match(rollout_id)
    return match.group(1) if match else None


def gym_member(rollout_id: str) -> Optional[tuple[str, int, int]]:
    """(task, rollout index, attempt) of a Gym rollout id, else None."""
    match = _GYM_ID.match(rollout_id)
    return (match.group(1), int(match.group(2)), int(match.group(3) or 0)) if match else None


class GroupSizeConflict(ValueError):
    """Another end declared another size for the same group: nothing changed."""


class RolloutEndConflict(ValueError):
    """The rollout was ended before with another outcome, group or size: nothing changed."""

    def __init__(self, existing: RolloutEnd) -> None:
        super().__init__(f"rollout {existing.rollout_id} was ended at {existing.ended_at} with another outcome, "
                         "group or group size; an end is never changed")
        self.existing = existing


def end_path(capture_dir: str, rollout_id: str) -> str:
    """``<capture_dir>/<rollout_id>.end.json`` for a validated rollout id."""
    return os.path.join(capture_dir, validate_rollout_id(rollout_id) + END_SUFFIX)


def end_request(body: bytes) -> tuple[Optional[dict[str, Any]], Optional[str], Optional[int]]:
    """The outcome, group and group size of an end's JSON body (empty: none of them); ValueError
    saying what is wrong otherwise."""
    if not body.strip():
        return None, None, None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"the body is not JSON: {exc}") from None
    if type(parsed) is not dict:
        raise ValueError('the body must be a JSON object: {"outcome": {...}, "group": "<key>", "group_size": G}')
    unknown = sorted(set(parsed) - {"outcome", "group", "group_size"})
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}: an end takes outcome, group and group_size")
    return checked_end(parsed.get("outcome"), parsed.get("group"), parsed.get("group_size"))


def checked_end(outcome: Any, group: Any, group_size: Any) -> tuple[Optional[dict[str, Any]], Optional[str], Optional[int]]:
    """The three values of an end, checked (ValueError saying which is wrong)."""
    if outcome is not None and type(outcome) is not dict:
        raise ValueError(f"outcome must be a JSON object (reward, metrics, ...) or null, not {type(outcome).__name__}")
    if outcome is not None:
        try:  # What the file will hold: JSON, finite numbers.
            orjson.dumps(outcome)
        except TypeError as exc:
            raise ValueError(f"outcome must be JSON: {exc}") from None
        _check_finite(outcome)
    if group is not None and (type(group) is not str or not group):
        raise ValueError("group must be a non-empty string or null")
    if group_size is not None and (type(group_size) is not int or group_size < 1):
        raise ValueError("group_size must be a positive integer or null")
    return outcome, group, group_size


def _check_finite(value: Any) -> None:
    if type(value) is float and not math.isfinite(value):
        raise ValueError("outcome holds a number that is not finite (JSON has no NaN or infinity)")
    if type(value) is dict:
        for item in value.values():
            _check_finite(item)
    elif type(value) is list:
        for item in value:
            _check_finite(item)


def write_rollout_end(capture_dir: str, rollout_id: str, outcome: Optional[dict[str, Any]] = None,
                      group: Optional[str] = None, group_size: Optional[int] = None,
                      token_dir: Optional[str] = None) -> tuple[RolloutEnd, bool]:
    """End ``rollout_id`` in ``capture_dir``, durably: the end, and whether this call wrote it
    (False: the same end was there). `RolloutEndConflict` when another end is there.
    ``token_dir``: where the training-token files are, when not beside the lines."""
    outcome, group, group_size = checked_end(outcome, group, group_size)
    path = end_path(capture_dir, rollout_id)
    existing = read_end_file(path)
    if existing is None:
        if group_size is not None:
            _declare_group_size(capture_dir, group_of(rollout_id, group), group_size)
        _freeze_token_files(token_dir or capture_dir, rollout_id)
        end = RolloutEnd(rollout_id=rollout_id, ended_at=time.time(), outcome=outcome, group=group,
                         group_size=group_size, calls=_whole_lines(capture_path(capture_dir, rollout_id)))
        if create_exclusively(path, orjson.dumps(end.model_dump()) + b"\n"):
            return end, True
        existing = read_end_file(path)  # Another writer's end won the race: it is the end.
        assert existing is not None
    if (existing.outcome, existing.group, existing.group_size) != (outcome, group, group_size):
        raise RolloutEndConflict(existing)
    return existing, False


def write_store_end(store: ObjectStore, rollout_id: str, outcome: Optional[dict[str, Any]] = None,
                    group: Optional[str] = None, group_size: Optional[int] = None,
                    ended_at: Optional[float] = None) -> tuple[RolloutEnd, bool]:
    """`write_rollout_end` for a capture store: the end object created with a conditional put (of
    two sidecars ending one rollout at once, exactly one wins), durable when this returns."""
    outcome, group, group_size = checked_end(outcome, group, group_size)
    name = end_object_name(rollout_id)
    existing = read_end_object(store, rollout_id)
    if existing is None:
        key = group_of(rollout_id, group)
        if group_size is not None and key is not None:
            declared = {"group": key, "group_size": group_size}
            digest = hashlib.sha256(key.encode()).hexdigest()[:32]
            if not store.create(f"{GROUP_OBJECTS}/{digest}.json", orjson.dumps(declared)):
                _check_declared_size(key, orjson.loads(store.get(f"{GROUP_OBJECTS}/{digest}.json")), group_size)
        end = RolloutEnd(rollout_id=rollout_id, ended_at=time.time() if ended_at is None else ended_at,
                         outcome=outcome, group=group, group_size=group_size, calls=None)
        if store.create(name, orjson.dumps(end.model_dump()) + b"\n"):
            return end, True
        existing = read_end_object(store, rollout_id)
        assert existing is not None
    if (existing.outcome, existing.group, existing.group_size) != (outcome, group, group_size):
        raise RolloutEndConflict(existing)
    return existing, False


def read_end_object(store: ObjectStore, rollout_id: str) -> Optional[RolloutEnd]:
    """The end of ``rollout_id`` in a capture store, or None."""
    data = store.get_if_present(end_object_name(rollout_id))
    return None if data is None else RolloutEnd.model_validate(orjson.loads(data))


#: In a sidecar's spool (a capture store's writer): ``ended/<rollout_id>``, one empty file per end
#: the sidecar knows of (its own, and those its uploader saw in the store), so its calls are refused.
SPOOL_ENDED = "ended"


def mark_ended_in_spool(spool_dir: str, rollout_id: str) -> None:
    """A capture store's writer learnt of an end: the rollout's training-token files in its spool
    are frozen (Gym's freeze: no entry after the end), then its later calls are refused here."""
    _freeze_token_files(spool_dir, rollout_id)
    directory = os.path.join(spool_dir, SPOOL_ENDED)
    os.makedirs(directory, exist_ok=True)
    fd = os.open(os.path.join(directory, validate_rollout_id(rollout_id)), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    os.close(fd)


def ended_in_spool(spool_dir: str, rollout_id: str) -> bool:
    return os.path.exists(os.path.join(spool_dir, SPOOL_ENDED, rollout_id))


def read_end_file(path: str) -> Optional[RolloutEnd]:
    """The end at ``path``, or None when there is none."""
    try:
        with open(path, "rb") as handle:
            return RolloutEnd.model_validate(orjson.loads(handle.read()))
    except FileNotFoundError:
        return None


def is_ended(capture_dir: str, rollout_id: str) -> bool:
    """Whether the rollout has an end (one ``stat``)."""
    return os.path.exists(end_path(capture_dir, rollout_id))


def create_exclusively(path: str, data: bytes, durable: bool = True) -> bool:
    """Write ``data`` as the new file ``path``, durably: False when ``path`` exists (left as it is).
    Of two writers of one name exactly one succeeds (an end; a group's size): see
    `create_file_exclusively`. With ``durable=False`` the caller makes it durable."""
    return create_file_exclusively(path, data, durable)


def _declare_group_size(capture_dir: str, group: Optional[str], size: int) -> None:
    """The first end that declares its group's size fixes it (``groups/<digest>.json``, created
    exclusively); another size is `GroupSizeConflict`."""
    if group is None:
        return
    directory = os.path.join(capture_dir, "groups")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, hashlib.sha256(group.encode()).hexdigest()[:32] + ".json")
    if create_exclusively(path, orjson.dumps({"group": group, "group_size": size})):
        return
    with open(path, "rb") as handle:
        _check_declared_size(group, orjson.loads(handle.read()), size)


def _check_declared_size(group: str, declared: dict[str, Any], size: int) -> None:
    if declared.get("group_size") != size:
        raise GroupSizeConflict(f"group {group!r} was declared of size {declared.get('group_size')} by an earlier end, "
                                f"not {size}")


def _whole_lines(path: str) -> int:
    try:
        with open(path, "rb") as handle:
            return handle.read().count(b"\n")
    except FileNotFoundError:
        return 0


def _freeze_token_files(token_dir: str, rollout_id: str) -> None:
    from ._token_files import TokenFiles  # Only a rollout with training-token files needs them.

    files = TokenFiles(token_dir)
    if os.path.exists(files.path(rollout_id, ".tokens.state.json")) or os.path.exists(files.path(rollout_id)):
        files.freeze(rollout_id)
