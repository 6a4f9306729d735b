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
from typing import Any, Callable, Optional

import orjson
from pydantic import BaseModel, ConfigDict

from ._calls_in_flight import PUBLISH_SECONDS, SILENT_SECONDS, calls_in_flight, read_in_flight
from ._errors import RecordsError
from ._file_contract import INCOMPLETE_SUFFIX, capture_path
from ._object_store import ObjectStore, create_file_exclusively
from ._rollout_ids import validate_rollout_id
from ._time_index import END_INDEX, add_to_index, add_to_store_index

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


class UnknownRollout(RecordsError, ValueError):
    """An end names a rollout with no capture, no call in flight and no calls anywhere (a typo, or
    the wrong directory): nothing was written. End it with ``allow_empty=True`` (HTTP: ``"allow_empty":
    true``) when it really made no call."""

    def __init__(self, rollout_id: str, where: str) -> None:
        super().__init__(f"rollout {rollout_id} is unknown in {where}: it has no captured call, no call in flight "
                         "and no training-token files, so nothing was ended (a typo in the id, or the wrong capture "
                         "directory?); a rollout that really made no call is ended with allow_empty")
        self.rollout_id = rollout_id


class RolloutEndConflict(ValueError):
    """The rollout was ended before with another outcome, group or size: nothing changed."""

    def __init__(self, existing: RolloutEnd) -> None:
        super().__init__(f"rollout {existing.rollout_id} was ended at {existing.ended_at} with another outcome, "
                         "group or group size; an end is never changed")
        self.existing = existing


def end_path(capture_dir: str, rollout_id: str) -> str:
    """``<capture_dir>/<rollout_id>.end.json`` for a validated rollout id."""
    return os.path.join(capture_dir, validate_rollout_id(rollout_id) + END_SUFFIX)


def end_request(body: bytes) -> tuple[Optional[dict[str, Any]], Optional[str], Optional[int], bool]:
    """The outcome, group, group size and ``allow_empty`` of an end's JSON body (empty: none of
    them); ValueError saying what is wrong otherwise."""
    if not body.strip():
        return None, None, None, False
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"the body is not JSON: {exc}") from None
    if type(parsed) is not dict:
        raise ValueError('the body must be a JSON object: {"outcome": {...}, "group": "<key>", "group_size": G}')
    unknown = sorted(set(parsed) - {"outcome", "group", "group_size", "allow_empty"})
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}: an end takes outcome, group, group_size and allow_empty")
    allow_empty = parsed.get("allow_empty", False)
    if type(allow_empty) is not bool:
        raise ValueError("allow_empty must be true or false")
    return (*checked_end(parsed.get("outcome"), parsed.get("group"), parsed.get("group_size")), allow_empty)


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
                      token_dir: Optional[str] = None, allow_empty: bool = False,
                      in_flight_here: bool = False) -> tuple[RolloutEnd, bool]:
    """End ``rollout_id`` in ``capture_dir``, durably: the end, and whether this call wrote it
    (False: the same end was there). `RolloutEndConflict` when another end is there;
    `UnknownRollout` when the rollout has left no trace (no capture, no call in flight, no token
    files) and ``allow_empty`` is not given. ``token_dir``: where the training-token files are,
    when not beside the lines; ``in_flight_here``: the caller (a sidecar) has a call of it under way."""
    outcome, group, group_size = checked_end(outcome, group, group_size)
    path = end_path(capture_dir, rollout_id)
    existing = read_end_file(path)
    if existing is None and not (allow_empty or in_flight_here or rollout_is_known(capture_dir, rollout_id, token_dir)):
        raise UnknownRollout(rollout_id, capture_dir)
    if existing is None:
        if group_size is not None:
            _declare_group_size(capture_dir, group_of(rollout_id, group), group_size)
        _freeze_token_files(token_dir or capture_dir, rollout_id)
        end = RolloutEnd(rollout_id=rollout_id, ended_at=time.time(), outcome=outcome, group=group,
                         group_size=group_size, calls=_whole_lines(capture_path(capture_dir, rollout_id)))
        add_to_index(capture_dir, END_INDEX, end.ended_at, rollout_id)  # First: an end never lacks its entry.
        if create_exclusively(path, orjson.dumps(end.model_dump()) + b"\n"):
            return end, True
        existing = read_end_file(path)  # Another writer's end won the race: it is the end.
        assert existing is not None
    if (existing.outcome, existing.group, existing.group_size) != (outcome, group, group_size):
        raise RolloutEndConflict(existing)
    return existing, False


def rollout_is_known(capture_dir: str, rollout_id: str, token_dir: Optional[str] = None) -> bool:
    """Whether a rollout of a capture directory has left a trace: a capture file (or its incomplete
    marker), training-token files, or a call in flight on a live sidecar."""
    base = validate_rollout_id(rollout_id)
    directories = {capture_dir, token_dir or capture_dir}
    suffixes = (".capture.jsonl", INCOMPLETE_SUFFIX, ".tokens.intents", ".tokens.jsonl")
    if any(os.path.exists(os.path.join(directory, base + suffix)) for directory in directories for suffix in suffixes):
        return True
    return calls_in_flight(read_in_flight(capture_dir), rollout_id, time.time()) > 0


#: How long `wait_until_quiet` waits for a sidecar's publication made after it began.
_FRESH_SECONDS = 1.0


def wait_until_quiet(capture_dir: str, rollout_id: str, seconds: float, exclude: Optional[str] = None) -> bool:
    """Wait (at most ``seconds``) until no live sidecar of ``capture_dir`` has a call of the rollout
    in flight, as each published after this began (Gym's capture quiescence before a freeze): the
    end that follows freezes nothing a call made before it still had to write. True when quiet.
    ``exclude``: a sidecar process's own publication (it knows its own calls in flight already)."""
    began = time.time()
    deadline = began + seconds
    while True:
        now = time.time()
        live = [record for record in read_in_flight(capture_dir)
                if now - record["at"] < SILENT_SECONDS and record.get("instance") != exclude]
        # Quiet: no live sidecar names it, as each published since this began (a call that started
        # just before is in its next publication); one that has not published within a second
        # (a busy loop) is taken at its last word.
        if all(rollout_id not in record["rollouts"] and (record["at"] > began or now - began > _FRESH_SECONDS)
               for record in live):
            return True
        if now >= deadline:
            return False
        time.sleep(PUBLISH_SECONDS / 2)


#: In a capture store: ``rollouts/<rollout_id>``, an empty object each writer puts before the first
#: segment it uploads with lines of the rollout: that it has calls in the store, at one request.
ROLLOUT_MARKERS = "rollouts"
#: A store's end of a rollout no writer has named yet looks again for this long (writers say what
#: their spools hold twice a second) before it is refused as unknown.
_STORE_LOOK_SECONDS = 1.5


def rollout_marker_name(rollout_id: str) -> str:
    return f"{ROLLOUT_MARKERS}/{validate_rollout_id(rollout_id)}"


def store_rollout_is_known(store: ObjectStore, rollout_id: str) -> bool:
    """Whether a capture store's rollout has left a trace: lines uploaded (its marker), or lines
    or a call in flight in a sidecar's spool (its writer's ``pending``)."""
    from ._writer_watermarks import read_watermarks  # (The writers' objects: a listing and a read each.)

    if store.get_if_present(rollout_marker_name(rollout_id)) is not None:
        return True
    return any(rollout_id in (writer.get("pending") or ()) for writer in read_watermarks(store))


def require_store_rollout(store: ObjectStore, rollout_id: str) -> None:
    """`UnknownRollout` unless the store's rollout has left a trace (`store_rollout_is_known`),
    looked for `_STORE_LOOK_SECONDS` (a first call in flight is named within a writer's round)."""
    deadline = time.monotonic() + _STORE_LOOK_SECONDS
    while not store_rollout_is_known(store, rollout_id):
        if time.monotonic() >= deadline:
            raise UnknownRollout(rollout_id, store.url)
        time.sleep(0.25)


def write_store_end(store: ObjectStore, rollout_id: str, outcome: Optional[dict[str, Any]] = None,
                    group: Optional[str] = None, group_size: Optional[int] = None,
                    ended_at: Optional[float] = None, allow_empty: bool = False,
                    known_here: bool = False) -> tuple[RolloutEnd, bool]:
    """`write_rollout_end` for a capture store: the end object created with a conditional put (of
    two sidecars ending one rollout at once, exactly one wins), durable when this returns.
    `UnknownRollout` when no writer has a trace of the rollout (`store_rollout_is_known`, looked
    for `_STORE_LOOK_SECONDS`) and ``allow_empty`` is not given; ``known_here``: the caller (a
    sidecar) served calls of it."""
    outcome, group, group_size = checked_end(outcome, group, group_size)
    name = end_object_name(rollout_id)
    existing = read_end_object(store, rollout_id)
    if existing is None and not (allow_empty or known_here):
        require_store_rollout(store, rollout_id)
    if existing is None:
        key = group_of(rollout_id, group)
        if group_size is not None and key is not None:
            declared = {"group": key, "group_size": group_size}
            digest = hashlib.sha256(key.encode()).hexdigest()[:32]
            if not store.create(f"{GROUP_OBJECTS}/{digest}.json", orjson.dumps(declared)):
                _check_declared_size(key, orjson.loads(store.get(f"{GROUP_OBJECTS}/{digest}.json")), group_size)
        end = RolloutEnd(rollout_id=rollout_id, ended_at=time.time() if ended_at is None else ended_at,
                         outcome=outcome, group=group, group_size=group_size, calls=None)
        add_to_store_index(store, END_INDEX, end.ended_at, rollout_id)  # First: an end never lacks its entry.
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


def end_lookup(directory: str, spool: bool = False) -> Callable[[str], bool]:
    """`is_ended` of ``directory`` (`ended_in_spool` of a spool: ``spool``) for rollout ids the
    caller has validated: one ``access`` each, the path's constant parts joined once. A writer
    asks it on every call (the sidecar, before a call goes upstream)."""
    prefix = os.path.join(directory, SPOOL_ENDED, "") if spool else os.path.join(directory, "")
    suffix = "" if spool else END_SUFFIX
    access, exists = os.access, os.F_OK
    return lambda rollout_id: access(prefix + rollout_id + suffix, exists)


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


# -- the run's end ---------------------------------------------------------------------------------

#: The run is over: ``run/end.json`` in a capture directory, the object ``run/end.json`` in a store.
#: Producers write it once every rollout of the run has ended; a consumer's loop ends on it
#: (`records.Consumer.batches`), and a short group is then handed out partial at once (no member
#: will come).
RUN_END = "run/end.json"


def run_end_record(info: Optional[dict[str, Any]]) -> dict[str, Any]:
    if info is not None and type(info) is not dict:
        raise ValueError(f"a run's end takes a JSON object (what the run did) or nothing, not {type(info).__name__}")
    if info is not None:
        _check_finite(info)
    return {"ended_at": time.time(), "info": info}


def write_run_end(capture_dir: str, info: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """End the run of ``capture_dir``, durably (created once: a second end returns the first)."""
    record = run_end_record(info)
    os.makedirs(os.path.join(capture_dir, "run"), exist_ok=True)
    path = os.path.join(capture_dir, RUN_END)
    if not create_exclusively(path, orjson.dumps(record) + b"\n"):
        existing = read_run_end(capture_dir)
        assert existing is not None
        return existing
    return record


def read_run_end(capture_dir: str) -> Optional[dict[str, Any]]:
    try:
        with open(os.path.join(capture_dir, RUN_END), "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    return orjson.loads(data) if data.strip() else None


def write_store_run_end(store: ObjectStore, info: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """`write_run_end` for a capture store: a conditional put."""
    record = run_end_record(info)
    if not store.create(RUN_END, orjson.dumps(record) + b"\n"):
        existing = read_store_run_end(store)
        assert existing is not None
        return existing
    return record


def read_store_run_end(store: ObjectStore) -> Optional[dict[str, Any]]:
    data = store.get_if_present(RUN_END)
    return orjson.loads(data) if data else None
