"""A durable consumer of ended rollouts: leases with epochs, acknowledgements tied to the trainer's
checkpoint (docs/reading.md, "Consuming rollouts during the run").

The state lives in the captures, beside the rollouts (a capture directory's files, or a capture
store's objects: `records.training._consumer_rooms`), so nothing else has to run:

    consumers/<name>/items/<item>.<slot>.json   one item's log: claim, extend, release, ack
    consumers/<name>/log/<seq>.json             the name's log: commit, rewind
    consumers/<name>/incarnations/<seq>.json    each start of the name (a trainer job; its ranks join it)

Every record is created exclusively (``O_EXCL`` in a directory: the create fails when the name
exists; a reader that finds a record empty waits for its writer, and one left empty by a writer
that died between its create and its write stands for nothing; a conditional put in a store) and
never changed. An item's log is a sequence of slots
1, 2, 3, ...: whoever acts on an item (a taker claiming it, its holder extending, releasing or
acknowledging) writes the next slot, after checking the item's state as of the slot before. Two
processes acting at once race for one slot: one wins, the other reads again and checks again. So
a claim's **epoch** is its slot: a lease that ran out is claimed again at a later slot (the next
epoch), and its old holder's ack, extend or release, which would need a slot after it, is refused
(`LeaseLost`), never applied.

An ack carries the trainer's step and the position of the name's log when it was made. A
``commit(T)`` (the trainer's checkpoint at step T is durable) makes every ack at a step <= T made
before it final; a ``rewind(T)`` (a trainer restarted from its checkpoint at T) undoes every ack
at a later step made before it and not yet final: those rollouts are handed out again. An ack
with no step is final at once.

**A start fences its past.** Each `Consumer` of a name starts an **incarnation** (the next number,
created exclusively), unless it joins one (``join``: the ranks of one trainer job). A claim carries
its incarnation; a claim of an earlier incarnation that was not acknowledged is void as soon as a
later one exists, so a restarted trainer's first take gets its crashed batch back at once, and
whatever an earlier incarnation says afterwards (take, ack, extend, release, commit, rewind) is
refused with `Fenced` (a `LeaseLost`). The lease's expiry still covers a holder that stalls.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import orjson

from ..store import read_model_call_records
from ._consumer_rooms import DirectoryRoom, StoreRoom, record_of
from ..contract import incomplete_marker_path
from ..store import ModelCallRecord
from ..contract.reading import is_store_url
from ..store import directory_of
from ..contract import RolloutEnd
from ..contract.reading import group_of, gym_member
from ..contract import is_valid_rollout_id
from ..contract.reading import validate_rollout_id
from ..store import capture_store
from ._token_records_reading import read_token_records
from ..contract import RoutedExperts
from ._routed_experts_reading import read_routed_experts
from ._trajectories import Trajectory, TrajectoryBuild, trajectories
from ..contract import INDEX_LAG_SECONDS, resolved_spans
from ..contract.reading import IN_FLIGHT_BOUND_SECONDS, token_versions, version_rank

Room = Union[DirectoryRoom, StoreRoom]

#: How often `Consumer.take` looks again while it waits for an ended rollout.
_POLL_SECONDS = 0.1
#: A group's item (its log's directory): this and a digest of its key (a key is any text).
_GROUP_ITEM = "~group-"  # "~" is in no rollout id: a group's item never meets a rollout's.
#: A slot found empty or half-written is being written for this long at most; older, its writer
#: died between its create and its write, and it stands for nothing (a void record).
_WRITING_SECONDS = 5.0
#: The name's checkpoints (`_ConsumerView._read_checkpoint`), and the hint that names the newest.
_CHECKPOINTS = "checkpoints"
_NEWEST_HINT = "checkpoints/newest"
#: An ack with no step writes a checkpoint at most this often (a commit always does).
_CHECKPOINT_EVERY_SECONDS = 5.0
#: A lazily read value not read yet.
_UNREAD = object()


class LeaseLost(RuntimeError):
    """The item's lease ran out and it was handed out again under a later epoch (or it was already
    acknowledged): what its older holder says of it is refused, never applied. ``lost``: the items
    refused (of an `ack`, `extend` or `release` of several, every other one was applied)."""

    def __init__(self, message: str, lost: Optional[list[Any]] = None) -> None:
        super().__init__(message)
        self.lost: list[Any] = lost or []


class Fenced(LeaseLost):
    """A later incarnation of the consumer name started (a restarted trainer job): this one's leases
    are void and nothing it says is applied any more. Start a new `Consumer` (or join the new
    incarnation: ``join=``)."""


@dataclass(frozen=True)
class Lease:
    """An item's lease: its epoch (the slot of its claim) and when it runs out (Unix seconds)."""

    epoch: int
    expires_at: float


@dataclass
class FinishedRollout:
    """An ended rollout handed to a consumer: its end, its trajectories, its lease; its calls and
    weight versions are read when first asked for (a trainer that takes trajectories only pays
    for those: `benchmarks/bench_handoff.py`)."""

    rollout_id: str
    ended_at: float
    outcome: Optional[dict[str, Any]]
    group: Optional[str]
    #: Exactly what `records.trajectories` builds for it.
    trajectories: TrajectoryBuild
    #: A line of the rollout could not be written (its ``.capture.incomplete`` marker), or, from a
    #: capture store, a sidecar that may hold some of its calls went silent past the writer bound
    #: (``Consumer(writer_bound_seconds=...)``): mask it.
    incomplete: bool
    lease: Lease
    #: Why it is ``incomplete``, when a call in flight or a silent writer made it so (else None).
    incomplete_reason: Optional[str] = None
    #: What the lease is of: the rollout, or the group it was handed out in.
    item: str = ""
    #: Weight updates between ``weight_versions["start"]`` and `take`'s ``current_version`` (None
    #: when either has no place in the order: `records.contract.version_rank`), and whether that is beyond
    #: ``max_staleness``.
    staleness: Optional[int] = None
    stale: bool = False
    directory: str = field(default="", repr=False)
    #: The capture store's URL it was taken from (its routed-expert objects are fetched from there), or None.
    store_url: Optional[str] = field(default=None, repr=False)
    _calls: Optional[list[ModelCallRecord]] = field(default=None, repr=False)
    _weight_versions: Any = field(default=_UNREAD, repr=False)
    _declared: Any = field(default=None, repr=False)

    @property
    def calls(self) -> list[ModelCallRecord]:
        """Its calls (`records.read_model_call_records`), in append order."""
        if self._calls is None:
            self._calls = read_model_call_records(self.directory, self.rollout_id)
        return self._calls

    def routed_experts(self, chain: Optional[Trajectory] = None) -> Optional[RoutedExperts]:
        """The routed experts of ``chain`` (default: the main chain), aligned with its tokens
        (`records.read_routed_experts`); None when none were stored."""
        chain = chain if chain is not None else self.trajectories.main
        if chain is None:
            return None
        return read_routed_experts(self.store_url or self.directory, self.rollout_id, chain)

    @property
    def weight_versions(self) -> Optional[dict[str, Any]]:
        """Which weights generated its tokens: ``start`` (the oldest version that generated any,
        in `records.contract.version_rank`'s order), ``min``, ``max``, ``tokens`` per version, and
        ``source``: ``token_records`` (the token capture mode's), else ``lines`` (the versions on its
        capture lines: the engine's, or those the trainer declared); None when its calls name no version."""
        if self._weight_versions is _UNREAD:
            self._weight_versions = _weight_versions_of(self.directory, self.rollout_id,
                                                        self._declared() if self._declared is not None else [])
        return self._weight_versions


@dataclass
class FinishedGroup:
    """A group handed out whole (its declared size of members ended), or ``partial`` after the
    straggler bound, naming the members it misses (Gym ids: ``<task>-<i>``); leased and
    acknowledged as one."""

    group: str
    rollouts: list[FinishedRollout]
    partial: bool
    missing: list[str]
    lease: Lease
    item: str = ""


@dataclass
class _Unit:
    """What one take hands out as one item: a rollout, or a group's members."""

    item: str
    members: list[RolloutEnd]
    ready_at: float
    group: Optional[str] = None
    partial: bool = False
    missing: list[str] = field(default_factory=list)


@dataclass
class _Item:
    """An item's log as read so far (slots are never changed: only new ones are read)."""

    slots: list[dict[str, Any]] = field(default_factory=list)


class _ConsumerView:
    """What a consumer name's state says, read from the captures (nothing written)."""

    #: A rollout with calls and no end counts as ``unended`` once its last call is this old.
    unended_seconds = 300.0
    #: An end's index entry lands within this of its stamp (`records.contract.INDEX_LAG_SECONDS`).
    index_lag_seconds = INDEX_LAG_SECONDS

    def __init__(self, room: Room, name: str) -> None:
        self.room = room
        self.name = name
        self._root = f"consumers/{name}"
        self._items: dict[str, _Item] = {}
        self._log: list[dict[str, Any]] = []
        self._log_listed = False
        self._ends: dict[str, RolloutEnd] = {}
        self._ended_sorted: list[RolloutEnd] = []
        #: Each ended rollout's group key (`group_of`), kept with the sorted ends.
        self._group_keys: dict[str, Optional[str]] = {}
        #: Items acknowledged for good, with their ack's flags (`_flags`): never looked at again.
        self._final: dict[str, int] = {}
        #: The newest incarnation of the name known: claims of earlier ones not acknowledged are void.
        self._fence = 0
        #: Every end stamped before the cursor is accounted for: final (counted in ``_base``), or
        #: open (kept in ``_ends``). Ends are listed from the cursor on (`_checkpoint`).
        self._cursor = 0.0
        self._base = {"final": 0, "dropped": 0, "stale": 0, "partial": 0}
        #: When the last listing of the ends began (a checkpoint's cursor is this less the index's lag).
        self._listed_at = 0.0
        #: The name's log as read: records at positions ``_log_base + 1`` on (earlier ones decide nothing open).
        self._log_base = 0
        #: Rollouts whose first line was written since the cursor (the start index), with when; and those
        #: started before it with no end as of the checkpoint.
        self._started: dict[str, float] = {}
        self._unended_carry: dict[str, float] = {}
        #: Started rollouts found ended though their end is not among the ends read (ended before the cursor).
        self._ended_elsewhere: set[str] = set()
        self._checkpoint_read = False

    def _incarnations(self) -> list[int]:
        return sorted(int(name.split(".")[0]) for name in self.room.names(f"{self._root}/incarnations")
                      if name[:1].isdigit() and name.endswith(".json"))

    def _read_fence(self) -> int:
        self._fence = max(self._incarnations(), default=0)
        return self._fence

    # -- counts ------------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Ended rollouts by where they stand for this name: ``final`` (acknowledged for good),
        ``pending`` (acknowledged, waiting for a commit), ``leased``, ``waiting``; and of those
        acknowledged (final or pending): ``dropped``, ``stale`` (handed out stale) and ``partial``
        (handed out in a partial group)."""
        self._read_checkpoint()
        self._read_log()
        self._read_fence()
        counts = {"final": 0, "pending": 0, "leased": 0, "waiting": 0, "dropped": 0, "stale": 0, "partial": 0}
        ended = self._ended()
        for key in ("final", "dropped", "stale", "partial"):
            counts[key] += self._base[key]  # Those before the cursor, final for good.
        counts["unended"] = len(self.unended())
        superseded = _superseded(end.rollout_id for end in ended)
        for end in ended:
            item = self._item_of(end)
            if item == end.rollout_id and end.rollout_id in superseded:
                continue  # An earlier attempt of a group member: its latest attempt stands for it.
            if item in self._final:  # Final for good (read in a summary): nothing to read.
                counts["final"] += 1
                flags = self._final[item]
            else:
                status, _, ack = self._state(self._current(item))
                counts[{"acked_final": "final", "acked_pending": "pending"}.get(status, status)] += 1
                flags = _flags(ack)
            for bit, key in _FLAG_NAMES:
                counts[key] += bool(flags & bit)
        return counts

    def unended(self) -> dict[Optional[str], list[str]]:
        """Rollouts that made calls and have no end, their last call older than ``unended_seconds``
        (a runner that crashed, an end sent with a typo'd id), by group key (Gym's task, else None):
        a group short of a member shows here instead of waiting in silence."""
        self._ended()
        keys = {key for key in self._group_keys.values() if key is not None}
        found: dict[Optional[str], list[str]] = {}
        for rollout_id in sorted(self._without_end(self.unended_seconds)):
            key = group_of(rollout_id, None)
            if key is None:  # Its group is named at its end; an id "<group>-..." of a known group is taken as one.
                key = next((known for known in sorted(keys) if rollout_id.startswith(known + "-")), None)
            found.setdefault(key, []).append(rollout_id)
        return found

    def _without_end(self, older_than: Optional[float]) -> list[str]:
        """Rollouts with captured calls and no end (their last line older than ``older_than``
        seconds, when given), from the start index since the cursor and those the checkpoint
        carried: what it reads grows with the rollouts started since, not with the run."""
        self._read_checkpoint()
        self._started.update(self.room.started_since(self._cursor))
        now, found = time.time(), []
        for rollout_id, stamp in {**self._unended_carry, **self._started}.items():
            if rollout_id in self._ends or rollout_id in self._ended_elsewhere:
                continue
            if older_than is not None:
                last = self.room.last_written(rollout_id)
                if now - (last if last is not None else stamp) < older_than:
                    continue
            if self.room.has_end(rollout_id):  # Ended before the cursor (a store names a rollout after its end).
                self._ended_elsewhere.add(rollout_id)
                continue
            found.append(rollout_id)
        return found

    def _unended_members(self, key: str) -> list[str]:
        """The rollouts of group ``key`` (by their Gym id, or an id ``<key>-...``) with captured calls
        and no end: what a partial group names as missing."""
        return sorted(rollout_id for rollout_id in self._without_end(None)
                      if group_of(rollout_id, None) == key or rollout_id.startswith(key + "-"))

    def _item_of(self, end: RolloutEnd) -> str:
        """The item an ended rollout is (or will be) handed out as: its group's item when a claim of
        the group names it, a late member's own item, else the rollout's (read from the items' logs,
        each known one not read again once acknowledged)."""
        key = self._group_keys.get(end.rollout_id) or group_of(end.rollout_id, end.group)
        if key is None:
            return end.rollout_id
        item = _group_item(key)
        if any(end.rollout_id in record.get("members", ()) for record in self._current(item)
               if record.get("kind") == "claim"):
            return item
        late = _group_item(f"{key}\0{end.rollout_id}")
        if self._current(late):
            return late
        return end.rollout_id

    def oldest_waiting(self) -> Optional[RolloutEnd]:
        """The end of the oldest ended rollout nobody of this name holds or has acknowledged."""
        self._read_checkpoint()
        self._read_log()
        self._read_fence()
        return next((end for end in self._ended() if self._state(self._current(self._item_of(end)))[0] == "waiting"), None)

    # -- the state -----------------------------------------------------------------------------------

    def _ended(self) -> list[RolloutEnd]:
        """Every ended rollout of the captures, oldest end first (ends never change: each read
        once, and sorted again only when new ones were read)."""
        self._read_checkpoint()  # (Once: the cursor the ends are listed from.)
        self._listed_at = time.time()
        self.room.new_ends(self._cursor, self._ends)
        if len(self._ended_sorted) != len(self._ends):
            self._ended_sorted = sorted(self._ends.values(), key=lambda end: (end.ended_at, end.rollout_id))
            self._group_keys = {end.rollout_id: group_of(end.rollout_id, end.group) for end in self._ended_sorted}
        return self._ended_sorted

    def _slots(self, rollout_id: str) -> list[dict[str, Any]]:
        """The item's log: the slots read before, and any written since."""
        item = self._items.setdefault(rollout_id, _Item())
        base = f"{self._root}/items/" + (rollout_id if rollout_id.startswith(_GROUP_ITEM)
                                         else validate_rollout_id(rollout_id))
        while True:
            name = f"{base}.{len(item.slots) + 1:010d}.json"
            found = self.room.read(name)
            if found is None:
                return item.slots
            data, age = found
            try:
                item.slots.append(record_of(name, orjson.loads(data)) or {"kind": "void"})
            except orjson.JSONDecodeError:
                if age < _WRITING_SECONDS:
                    return item.slots  # Its writer is writing it: the log ends before it for now.
                item.slots.append({"kind": "void"})  # Its writer died between create and write.

    def _known(self, item: str) -> list[dict[str, Any]]:
        """The item's log as read so far (no read)."""
        known = self._items.get(item)
        return known.slots if known is not None else []

    def _current(self, item: str) -> list[dict[str, Any]]:
        """The item's log, read again unless what was read says it is acknowledged (then only the
        name's log can change its standing)."""
        slots = self._known(item)
        return slots if slots and self._state(slots)[0].startswith("acked") else self._slots(item)

    def _slot_taken(self, rollout_id: str) -> None:
        """Another writer won the race for the item's next slot: give it a moment to write it (a
        live writer writes at once after its create)."""
        deadline = time.monotonic() + 0.05
        count = len(self._items[rollout_id].slots) if rollout_id in self._items else 0
        while len(self._slots(rollout_id)) == count and time.monotonic() < deadline:
            time.sleep(0.001)

    def _read_log(self) -> None:
        """The name's log records written since those read (from the checkpoint's position on:
        a restart reads the few that can still decide an ack, not the run's every commit)."""
        while True:
            record = self.room.read(f"{self._root}/log/{self._log_position() + 1:010d}.json")
            if record is None:
                return
            try:
                self._log.append(orjson.loads(record[0]))
            except orjson.JSONDecodeError:
                if record[1] < _WRITING_SECONDS:
                    return  # Its writer is writing it.
                self._log.append({"kind": "void"})

    def _log_position(self) -> int:
        """How many records the name's log has, as read."""
        return self._log_base + len(self._log)

    # -- checkpoints -------------------------------------------------------------------------------

    def _newest_checkpoint(self) -> int:
        """The newest checkpoint's number (0: none): from the hint on, probed forward (doubling,
        then halving), so finding it costs a few reads however many there are."""
        hint = self.room.read(f"{self._root}/{_NEWEST_HINT}")
        try:
            low = max(0, int(hint[0])) if hint else 0
        except ValueError:
            low = 0
        if low and not self.room.exists(_checkpoint_name(self._root, low)):
            low = 0  # A hint from elsewhere: start over.
        step = 1
        while self.room.exists(_checkpoint_name(self._root, low + step)):
            low, step = low + step, step * 2
        high = low + step  # Missing; every number up to low exists (they are created in order).
        while high - low > 1:
            middle = (low + high) // 2
            if self.room.exists(_checkpoint_name(self._root, middle)):
                low = middle
            else:
                high = middle
        return low

    def _read_checkpoint(self) -> None:
        """Start from the newest readable checkpoint (once): its cursor, the final counts before it,
        the ends before it still open, the rollouts started before it with no end, and where the
        name's log can still decide an ack."""
        if self._checkpoint_read:
            return
        self._checkpoint_read = True
        number = self._newest_checkpoint()
        while number > 0:
            found = self.room.read(_checkpoint_name(self._root, number))
            try:
                record = orjson.loads(found[0]) if found else None
            except orjson.JSONDecodeError:
                record = None  # Being written, or left empty by a writer that died: the one before says enough.
            if isinstance(record, dict) and type(record.get("cursor")) in (int, float):
                break
            number -= 1
        else:
            return
        self._cursor = float(record["cursor"])
        self._base.update({key: int(value) for key, value in (record.get("counts") or {}).items() if key in self._base})
        for data in [*(record.get("open") or ()), *(record.get("recent") or ())]:
            end = RolloutEnd.model_validate(data)
            self._ends[end.rollout_id] = end
        self._unended_carry = {rollout_id: float(stamp) for rollout_id, stamp in (record.get("unended") or {}).items()}
        self._final.update({item: flags for item, flags in (record.get("final_after") or {}).items() if type(flags) is int})
        self._log_base = max(0, int(record.get("log_from") or 0))

    def _state(self, slots: list[dict[str, Any]]) -> tuple[str, Optional[int], Optional[dict[str, Any]]]:
        """(``waiting`` / ``leased`` / ``acked_pending`` / ``acked_final``, the current epoch, the
        standing ack) of an item's log, as of the name's log read so far."""
        epoch: Optional[int] = None
        expires_at = 0.0
        ack: Optional[dict[str, Any]] = None
        incarnation = 0
        for slot, record in enumerate(slots, start=1):
            kind = record.get("kind")
            if kind == "claim":
                epoch, expires_at, ack = slot, record["expires_at"], None
                incarnation = record.get("incarnation") or 0
            elif record.get("epoch") != epoch:
                continue  # Written by a holder that lost the race for its slot's predecessor: never so.
            elif kind == "extend":
                expires_at = record["expires_at"]
            elif kind == "release":
                expires_at = 0.0
            elif kind == "ack":
                ack, expires_at = record, 0.0
        if ack is not None:
            standing = self._ack_standing(ack)
            if standing != "undone":
                return f"acked_{standing}", epoch, ack
        if epoch is not None and expires_at > time.time() and incarnation >= self._fence:
            return "leased", epoch, None  # (A claim of an incarnation fenced by a restart holds nothing.)
        return "waiting", epoch, None

    def _ack_standing(self, ack: dict[str, Any]) -> str:
        """``final``, ``pending`` or ``undone``: what the commits and rewinds after the ack made of it."""
        step = ack.get("step")
        if step is None:
            return "final"
        for record in self._log[max(0, ack.get("after_log", 0) - self._log_base):]:
            if record["kind"] == "void":
                continue
            if record["kind"] == "commit" and record["step"] >= step:
                return "final"
            if record["kind"] == "rewind" and record["step"] < step:
                return "undone"
        return "pending"


class Consumer(_ConsumerView):
    """Ended rollouts of ``captures`` (a capture directory, a `CaptureStore`, or a capture store's
    URL) handed to the consumer ``name``: every ended rollout exactly once as of the trainer's last
    commit. Several processes with one name share the work; different names each get every rollout.

    From a capture store, a rollout is handed out once every sidecar's watermark says it holds
    nothing more of it; a sidecar that went silent holding some of it (or that had not seen its
    end) holds it back for ``writer_bound_seconds``, after which it is handed out ``incomplete``."""

    #: `take`'s current version and its bound (`_finished`).
    _currency: tuple[Optional[str], Optional[int]] = (None, None)

    def __init__(self, captures: object, name: str, *, lease_seconds: float = 300.0, retires: bool = False,
                 straggler_seconds: float = 600.0, writer_bound_seconds: float = 60.0,
                 join: Union[None, bool, int] = None, in_flight_bound_seconds: float = IN_FLIGHT_BOUND_SECONDS,
                 unended_seconds: float = 300.0, index_lag_seconds: float = INDEX_LAG_SECONDS) -> None:
        room = _room(captures, "Consumer")
        if isinstance(room, DirectoryRoom) and not os.path.isdir(room.directory):
            raise FileNotFoundError(f"Consumer: no capture directory at {room.directory}")
        if retires and isinstance(room, StoreRoom):
            raise ValueError("retires=True marks the training-token files of a capture directory; a capture store's "
                             "live in the sidecars' spools, which retire nothing: consume without retires")
        if not is_valid_rollout_id(name):
            raise ValueError(f"a consumer name is 1-200 characters of [A-Za-z0-9._-] starting with a letter or "
                             f"digit, not {name!r}")
        if not lease_seconds > 0:
            raise ValueError("lease_seconds must be positive")
        super().__init__(room, name)
        self.lease_seconds = float(lease_seconds)
        #: Mark Gym's ``retired`` state for a rollout's training-token files once its ack is final
        #: (committed, or with no step), never before.
        self.retires = retires
        #: A group still short this long after its first member ended is handed out ``partial``.
        self.straggler_seconds = float(straggler_seconds)
        #: From a store: how long a silent sidecar that may hold a rollout's calls holds it back.
        self.writer_bound_seconds = float(writer_bound_seconds)
        #: How long a call in flight at its rollout's end holds the rollout back; after it, the
        #: rollout is handed out ``incomplete``, naming the calls (``incomplete_reason``).
        self.in_flight_bound_seconds = float(in_flight_bound_seconds)
        self.unended_seconds = float(unended_seconds)
        #: How long after its stamp an end's index entry may land (the write's time and the nodes'
        #: clock skew): a checkpoint's cursor stays this far behind its listing (docs/reading.md).
        self.index_lag_seconds = float(index_lag_seconds)
        self.holder = f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        room.prepare(self._root)  # Refuses storage where exclusive create does not hold.
        #: This process's incarnation of the name: a new one (fencing every earlier one), or the
        #: one it joins (``join=<number>``, or ``join=True``: the newest).
        self.incarnation = self._start_incarnation(join)
        self._read_checkpoint()
        self._checkpointed_at = 0.0
        #: Ended rollouts a store's watermarks say may be short for good (`_units`), or that a call
        #: in flight held back past ``in_flight_bound_seconds`` (with why).
        self._incomplete: set[str] = set()
        self._incomplete_why: dict[str, str] = {}

    # -- incarnations ----------------------------------------------------------------------------

    def _start_incarnation(self, join: Union[None, bool, int]) -> int:
        if join is not None and join is not False:
            newest = self._read_fence()
            if join is True and newest == 0:  # The first rank of the first start: it starts it.
                if self.room.create(f"{self._root}/incarnations/{1:010d}.json",
                                    orjson.dumps({"holder": self.holder, "at": time.time()})):
                    self.room.barrier()
                newest = self._read_fence()
            wanted = newest if join is True else join
            if type(wanted) is not int or wanted < 0:
                raise ValueError(f"join takes an incarnation number (a Consumer's .incarnation) or True, not {join!r}")
            if wanted < 1 or wanted > newest:
                raise ValueError(f"consumer {self.name}: there is no incarnation {wanted} to join (the newest is {newest})")
            if wanted < newest:
                raise Fenced(f"consumer {self.name}: incarnation {wanted} was fenced by incarnation {newest} "
                             "(a restart of the job): join the new one")
            return wanted
        while True:  # The next number, created exclusively: two starts at once get two numbers.
            number = self._read_fence() + 1
            record = orjson.dumps({"holder": self.holder, "at": time.time()})
            if self.room.create(f"{self._root}/incarnations/{number:010d}.json", record):
                self.room.barrier()  # Durable before anything is taken under it.
                self._fence = number
                return number

    def _check_fenced(self, lost: Optional[list[Any]] = None) -> None:
        """`Fenced` when a later incarnation of the name started: this one may say nothing more."""
        newest = self._read_fence()
        if newest > self.incarnation:
            raise Fenced(f"consumer {self.name}: this process's incarnation {self.incarnation} was fenced by "
                         f"incarnation {newest} (a restart of the job): its leases are void and nothing it says is "
                         "applied", list(lost or []))

    # -- taking --------------------------------------------------------------------------------

    def take(self, max_items: int = 1, *, wait: float = 0.0, group_size: Optional[int] = None,
             max_staleness: Optional[int] = None, current_version: Optional[str] = None) -> list[Any]:
        """Up to ``max_items`` items (rollouts; **groups** when grouped: ``take(8, group_size=4)`` is
        up to 8 groups, 32 rollouts) no process of this name holds or has acknowledged for good,
        oldest end first, each leased to this consumer for ``lease_seconds``; waits up to ``wait``
        seconds for at least one. An item is a `FinishedRollout`, or a `FinishedGroup` for
        rollouts in a group whose size is known (declared at their end, else ``group_size``; the
        key: the group given at the end, else the task of Gym's ``<task>-<rollout>[-a<n>]`` ids,
        the latest attempt of each): only whole groups are handed out, or, after
        ``straggler_seconds``, a short one marked ``partial``. A name takes with one ``group_size``.

        Each rollout says which weights generated it and, given ``current_version``, its
        staleness (weight updates since its ``start`` version, in the engine's integer order or
        the order the trainer declared them): beyond ``max_staleness`` it is marked ``stale``,
        never withheld; the trainer acknowledges what it drops (``ack(..., dropped=True)``)."""
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        if group_size is not None and (type(group_size) is not int or group_size < 1):
            raise ValueError("group_size must be a positive integer or None")
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            taken = self._take(max_items, group_size, (current_version, max_staleness))
            if taken or time.monotonic() >= deadline:
                return taken
            time.sleep(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic())))

    def batches(self, max_items: int = 1, *, wait: float = 1.0, **take: Any) -> Iterator[list[Any]]:
        """`take`'s batches until the run is over: the run's end was said (`records.end_run`, ``POST
        /-/run/end``) and this name holds or waits for nothing more (every ended rollout acknowledged;
        a short group is handed out partial at once after the run's end). Never ends on an empty take
        while rollouts are leased, waiting for their group, or held back by a call in flight."""
        while True:
            batch = self.take(max_items, wait=wait, **take)
            if batch:
                yield batch
            elif self.run_over():
                return

    def run_over(self) -> bool:
        """The run's end was said and nothing of it is left for this name (none waiting, none
        leased: acknowledged ones may still wait for a commit)."""
        if self.room.run_ended() is None:
            return False
        counts = self.counts()
        return counts["waiting"] == 0 and counts["leased"] == 0

    def _take(self, max_items: int, group_size: Optional[int], currency: tuple[Optional[str], Optional[int]]
              ) -> list[Any]:
        self._check_fenced()
        self._read_log()
        self._currency = currency
        units = [unit for unit in self._units(group_size) if unit.item not in self._final]
        leases = self._claim_batch(units[:max_items])  # What was read says they wait: claimed at once.
        for unit in units:
            if len(leases) >= max_items:
                break
            if unit.item not in leases:  # Another process wrote its log since (or it is leased): read again.
                lease = self._claim(unit.item, self._members(unit))
                if lease is not None:
                    leases[unit.item] = lease
        claimed = [(unit, leases[unit.item]) for unit in units if unit.item in leases][:max_items]
        self.room.barrier()  # The claims are durable before the items are handed out.
        if not claimed:
            return []
        directory = self.room.view([end.rollout_id for unit, _ in claimed for end in unit.members])
        taken: list[Any] = []
        for unit, lease in claimed:
            rollouts = [self._finished(end, lease, unit.item, directory) for end in unit.members]
            taken.append(rollouts[0] if unit.group is None else
                         FinishedGroup(unit.group, rollouts, unit.partial, unit.missing, lease, unit.item))
        return taken

    def _units(self, group_size: Optional[int]) -> list[_Unit]:
        """The ended rollouts as what is handed out, oldest first: each rollout alone, or its group
        once whole (or past the straggler bound); a group not yet ready is left for later."""
        units: list[_Unit] = []
        groups: dict[str, list[RolloutEnd]] = {}
        sizes: dict[str, int] = {}
        self.room.look()
        ended, final, keys = self._ended(), self._final, self._group_keys
        readiness_of = self.room.readiness
        run_over = self.room.run_ended() is not None
        #: Groups with a member that ended and is held back (a sidecar still ships its calls, or one
        #: is in flight): never handed out partial without it, not even after the run's end.
        held_back: set[str] = set()
        for end in ended:
            key = keys[end.rollout_id]
            size = end.group_size or group_size
            alone = key is None or size is None
            if end.rollout_id in final:
                if alone:
                    continue  # Acknowledged for good: never handed out again.
            else:  # Whole yet? (From a store: every writer's watermark.)
                readiness = readiness_of(end, self.writer_bound_seconds)
                if readiness == "wait":
                    if key is not None:
                        held_back.add(key)
                    continue  # Not ended for this consumer yet: some sidecar still ships its calls.
                if readiness == "incomplete":
                    self._incomplete.add(end.rollout_id)
                barrier, why = self.room.in_flight(end, self.in_flight_bound_seconds)
                if barrier == "wait":
                    if key is not None:
                        held_back.add(key)
                    continue  # A call of it is still in flight (one write barrier, docs/reading.md).
                if barrier == "incomplete":
                    self._incomplete.add(end.rollout_id)
                    self._incomplete_why[end.rollout_id] = why or "a call in flight past the bound"
            if key is None or size is None:  # Alone (spelt out: mypy narrows key and size by it).
                units.append(_Unit(end.rollout_id, [end], end.ended_at))
                continue
            groups.setdefault(key, []).append(end)
            sizes[key] = end.group_size or sizes.get(key) or size
        now = time.time()
        for key, ends in groups.items():
            latest: dict[Any, RolloutEnd] = {}  # The latest attempt of each member.
            for end in ends:
                member = gym_member(end.rollout_id)
                slot = member[:2] if member is not None and end.group is None else end.rollout_id
                kept = latest.get(slot)
                if kept is None or (member is not None and member[2] > (gym_member(kept.rollout_id) or ("", 0, -1))[2]):
                    latest[slot] = end
            members = sorted(latest.values(), key=lambda end: (end.ended_at, end.rollout_id))
            size, item = sizes[key], _group_item(key)
            taken = self._handed_out_members(item, read=len(members) < size)
            if taken is not None:  # Handed out already (partial): a member that came after goes on its own.
                units += [_Unit(_group_item(f"{key}\0{end.rollout_id}"), [end], end.ended_at, key, True, sorted(taken))
                          for end in members if end.rollout_id not in taken]
                continue
            if len(members) >= size:
                units.append(_Unit(item, members, members[-1].ended_at, key))
            elif key in held_back:
                continue  # A member ended and is on its way: the group waits for it (bounded by the barriers).
            elif run_over or now - members[0].ended_at >= self.straggler_seconds:
                present = {gym_member(end.rollout_id)[1] for end in members if gym_member(end.rollout_id)}  # type: ignore[index]  # members here are Gym ids (checked in the condition)
                missing = ([f"{key}-{index}" for index in range(size) if index not in present]
                           if all(gym_member(end.rollout_id) for end in members) and members[0].group is None else [])
                # Members that made calls and never ended are named as they are (a typo'd end, a crashed runner).
                unended = self._unended_members(key)
                missing = sorted(set(unended) | set(missing) - {_task_index(rollout_id) for rollout_id in unended})
                ready_at = members[0].ended_at + self.straggler_seconds
                units.append(_Unit(item, members, min(ready_at, now) if run_over else ready_at, key, True, missing))
        return sorted(units, key=lambda unit: (unit.ready_at, unit.item))

    def _handed_out_members(self, item: str, read: bool = False) -> Optional[set[str]]:
        """The members a group's item was handed out with, as its log was read (``read``: read again
        first, for a group short of members, whose others may have been handed out before this
        process started, or before the cursor), or None while it waits to be."""
        slots = self._current(item) if read else self._known(item)
        if not slots or self._state(slots)[0] == "waiting":
            return None
        return {member for record in slots if record.get("kind") == "claim" for member in record.get("members", ())}

    @staticmethod
    def _members(unit: _Unit) -> Optional[list[str]]:
        return [end.rollout_id for end in unit.members] if unit.group is not None else None

    def _claim_record(self, members: Optional[list[str]]) -> dict[str, Any]:
        record: dict[str, Any] = {"kind": "claim", "holder": self.holder, "expires_at": time.time() + self.lease_seconds,
                                  "incarnation": self.incarnation}
        if members is not None:
            record["members"] = members
        return record

    def _claim_batch(self, units: list[_Unit]) -> dict[str, Lease]:
        """The units whose logs as read say they wait, each claimed at its next slot, all at once
        (`_append_many`); the leases of those claimed."""
        wanted = {}
        for unit in units:
            slots = self._known(unit.item)
            if self._state(slots)[0] == "waiting":
                wanted[unit.item] = (len(slots) + 1, self._claim_record(self._members(unit)))
        created = self._append_many(wanted)
        return {item: Lease(wanted[item][0], wanted[item][1]["expires_at"]) for item in created}

    def _claim(self, item: str, members: Optional[list[str]] = None) -> Optional[Lease]:
        """Claim the item if it is waiting: its next slot created at once from what was read of it
        before (optimistic: a slot written since makes the create fail, and the log is read again),
        so a take costs one create per item handed out, not a read of every item's log."""
        slots, fresh = self._known(item), False
        while True:
            status = self._state(slots)[0]
            if status == "acked_final":
                self._final[item] = _flags(self._state(slots)[2])
            if status.startswith("acked"):
                return None  # Only a rewind (the name's log, read already) undoes an ack.
            if status == "leased" and not fresh:  # Its holder may have acknowledged or released it since.
                slots, fresh = self._slots(item), True
                continue
            if status != "waiting":
                return None
            record = self._claim_record(members)
            claimed_at = len(slots) + 1
            if self._append(item, claimed_at, record):
                return Lease(claimed_at, record["expires_at"])
            slots, fresh = self._slots(item), True
            if len(slots) < claimed_at:
                return None  # Its slot is still being written (or was left empty): not this time.

    def _finished(self, end: RolloutEnd, lease: Lease, item: str, directory: str) -> FinishedRollout:
        incomplete = (end.rollout_id in self._incomplete
                      or os.path.exists(incomplete_marker_path(directory, end.rollout_id)))
        reason = self._incomplete_why.get(end.rollout_id) or (
            "a sidecar holding some of its calls went silent past the writer bound" if end.rollout_id in self._incomplete
            else "a line of it could not be written" if incomplete else None)
        finished = FinishedRollout(rollout_id=end.rollout_id, ended_at=end.ended_at, outcome=end.outcome,
                                   group=end.group, trajectories=trajectories(directory, end.rollout_id),
                                   incomplete=incomplete, incomplete_reason=reason, lease=lease, item=item,
                                   directory=directory,
                                   store_url=self.room.where if isinstance(self.room, StoreRoom) else None,
                                   _declared=self.room.declared_versions)
        current, max_staleness = self._currency
        versions = finished.weight_versions if current is not None else None
        if current is not None and versions is not None and versions["start"] is not None:
            rank = version_rank([*versions["tokens"], current], self.room.declared_versions())
            if current in rank and versions["start"] in rank:
                finished.staleness = max(0, rank[current] - rank[versions["start"]])
                finished.stale = max_staleness is not None and finished.staleness > max_staleness
        return finished

    # -- what the holder says ---------------------------------------------------------------------

    def ack(self, items: Iterable[Any], *, step: Optional[int] = None, dropped: bool = False) -> None:
        """The items (rollouts or groups) are used (or, ``dropped``, deliberately not trained on):
        durable before this returns; final at once with ``step=None``, else once `commit` covers
        ``step``. An item whose lease was lost is refused: `LeaseLost` names them (``lost``), after
        every other item was acknowledged."""
        if step is not None and (type(step) is not int or step < 0):
            raise ValueError("step must be a non-negative integer or None")
        self._read_log()
        acked = self._each(items, lambda item: {
            "kind": "ack", "step": step, "dropped": bool(dropped), "after_log": self._log_position(),
            "stale": any(rollout.stale for rollout in getattr(item, "rollouts", [item])),
            "partial": bool(getattr(item, "partial", False))})
        if step is None:
            for item in acked:
                self._final[item.item] = _flags(self._state(self._known(item.item))[2])
                self._retire(item.item, [rollout.rollout_id for rollout in getattr(item, "rollouts", [item])])
            if time.time() - self._checkpointed_at >= _CHECKPOINT_EVERY_SECONDS:
                self._checkpoint()

    def extend(self, items: Iterable[Any]) -> None:
        """Renew the items' leases for ``lease_seconds`` from now (`LeaseLost` as `ack`)."""
        renewed_until = time.time() + self.lease_seconds
        for item in self._each(items, lambda item: {"kind": "extend", "expires_at": renewed_until}):
            item.lease = Lease(item.lease.epoch, renewed_until)

    def release(self, items: Iterable[Any]) -> None:
        """Hand the items back now: another process of this name may take them (`LeaseLost` as `ack`)."""
        self._each(items, lambda item: {"kind": "release"})

    def _each(self, items: Iterable[Any], record: Callable[[Any], dict[str, Any]]) -> list[Any]:
        """``record(item)`` written for each item whose lease holds, all durable at once; the
        items done, or `LeaseLost` naming those refused once the others are durable."""
        done, lost, said = [], [], []
        items = list(items)
        self._check_fenced(items)
        try:
            # Those whose lease holds as read: written at once (`_append_many`); the rest one by one.
            wanted, by_item = {}, {}
            for item in items:
                slots = self._known(item.item)
                status, epoch, _ = self._state(slots)
                if epoch == item.lease.epoch and not status.startswith("acked") and item.item not in wanted:
                    wanted[item.item] = (len(slots) + 1, {**record(item), "epoch": item.lease.epoch})
                    by_item[item.item] = item
            written = self._append_many(wanted)
            done += [by_item[key] for key in written]
            for item in items:
                if item.item in written and by_item.get(item.item) is item:
                    continue
                try:
                    self._act(item, record(item))
                    done.append(item)
                except LeaseLost as refused:
                    lost.append(item)
                    said.append(str(refused))
        finally:
            self.room.barrier()
        if lost:
            raise LeaseLost("; ".join(said), lost)
        return done

    def _act(self, item: Any, record: dict[str, Any]) -> None:
        """Write ``record`` as the next slot of the item's log, if its lease is still this one's."""
        record = {**record, "epoch": item.lease.epoch}
        what = f"group {item.group}" if isinstance(item, FinishedGroup) else f"rollout {item.rollout_id}"
        slots, fresh = self._known(item.item), False
        while True:
            status, epoch, _ = self._state(slots)
            # A lease that ran out still holds while nobody took the item again (a later epoch).
            if epoch != item.lease.epoch or status.startswith("acked"):
                if not fresh:  # Said by what was read before: read again first.
                    slots, fresh = self._slots(item.item), True
                    continue
                raise LeaseLost(f"{what}: its lease of epoch {item.lease.epoch} is no longer held "
                                f"({'it was acknowledged' if status.startswith('acked') else 'it was handed out again under epoch ' + str(epoch)})")
            if self._append(item.item, len(slots) + 1, record):
                return
            slots, fresh = self._slots(item.item), True

    def _append_many(self, wanted: dict[str, tuple[int, dict[str, Any]]]) -> set[str]:
        """Each item's record (item -> (slot, record)) at its slot, created exclusively, all at once
        (`room.create_many`); the items written. Durable at the operation's barrier."""
        if len(wanted) < 2:
            return {item for item, (slot, record) in wanted.items() if self._append(item, slot, record, wait=False)}
        now = time.time()
        names = {f"{self._root}/items/{item}.{slot:010d}.json": item for item, (slot, _) in wanted.items()}
        records = {name: {**wanted[item][1], "at": now, "holder": self.holder} for name, item in names.items()}
        written = set()
        for name in self.room.create_many(records):
            item = names[name]
            known = self._items.setdefault(item, _Item())
            if len(known.slots) == wanted[item][0] - 1:
                known.slots.append(orjson.loads(orjson.dumps(records[name])))  # As a reader will read it.
            written.add(item)
        return written

    def _append(self, rollout_id: str, slot: int, record: dict[str, Any], wait: bool = True) -> bool:
        """The item's next slot, created exclusively; durable at the operation's barrier."""
        written = {**record, "at": time.time(), "holder": self.holder}
        if self.room.create(f"{self._root}/items/{rollout_id}.{slot:010d}.json", orjson.dumps(written)):
            known = self._items.setdefault(rollout_id, _Item())
            if len(known.slots) == slot - 1:
                known.slots.append(orjson.loads(orjson.dumps(written)))  # As a reader will read it.
            return True
        if wait:
            self._slot_taken(rollout_id)
        return False

    # -- the trainer's checkpoints ------------------------------------------------------------------

    def commit(self, step: int) -> None:
        """The trainer's checkpoint at ``step`` is durable: every ack at a step <= ``step`` is final."""
        self._check_fenced()
        self._log_record({"kind": "commit", "step": _step(step)})
        if self.retires:
            members: dict[str, list[str]] = {}
            for end in self._ended():
                members.setdefault(self._item_of(end), []).append(end.rollout_id)
            for item in members.keys() - self._final.keys():
                if self._state(self._current(item))[0] == "acked_final":
                    self._retire(item, members[item])
        self._checkpoint()

    def _checkpoint(self) -> None:
        """A new checkpoint of the name (``consumers/<name>/checkpoints/<seq>.json``, created
        exclusively, never changed), after a commit: its cursor is when this process last listed
        the ends less the index's lag (`records.contract.INDEX_LAG_SECONDS`: every end stamped
        before it has landed and was read); the final counts of the ends before it; the ends
        before it that are not final (waiting, leased, or acknowledged with a step not committed);
        the rollouts started before it with no end; and the log's position from which its records
        can still decide an ack. A process that starts reads the newest and lists the ends from its
        cursor on, so what a take, a commit, a restart or `counts` reads grows with the work since
        the last checkpoint, never with the run. It says only what is true whenever it is read
        (what is final stays final), so checkpoints of several ranks at once are each whole."""
        self._checkpointed_at = time.time()
        ended = self._ended()
        self._read_log()
        cursor = self._listed_at - self.index_lag_seconds
        if cursor <= self._cursor:
            return
        base, still_open, pruned, pending_from = dict(self._base), {}, [], []
        superseded = _superseded(end.rollout_id for end in ended)
        for end in ended:
            if end.ended_at >= cursor:
                break  # Oldest end first: the rest are after the cursor.
            item = self._item_of(end)
            if item == end.rollout_id and end.rollout_id in superseded:
                pruned.append(end.rollout_id)  # An earlier attempt: never counted, never handed out.
                continue
            if item in self._final:
                status, flags = "acked_final", self._final[item]
            else:
                status, _, standing = self._state(self._current(item))
                flags = _flags(standing)
            if status == "acked_final":
                base["final"] += 1
                for bit, key in _FLAG_NAMES:
                    base[key] += bool(flags & bit)
                pruned.append(end.rollout_id)
                continue
            still_open[end.rollout_id] = end
            # Its acks' standing (pending, or undone by a rewind) is read from the log after them.
            pending_from += [int(record.get("after_log") or 0) for record in self._known(item) if record.get("kind") == "ack"]
        # The log's records an ack after the cursor may still need: those written since the ends
        # before the cursor landed (their clocks within the index's lag), and any an open ack needs.
        recent = next((self._log_base + offset for offset, record in enumerate(self._log)
                       if float(record.get("at") or 0.0) >= cursor - 2 * self.index_lag_seconds), self._log_position())
        log_from = min([recent, *pending_from])
        self._started.update(self.room.started_since(self._cursor))
        unended = {rollout_id: stamp for rollout_id, stamp in {**self._unended_carry, **self._started}.items()
                   if stamp < cursor and rollout_id not in self._ends and rollout_id not in self._ended_elsewhere}
        unended = {rollout_id: stamp for rollout_id, stamp in unended.items() if not self.room.has_end(rollout_id)}
        # The ends after the cursor this process has read, and the items of theirs it knows final: a
        # restart need not fetch them, nor read those items' logs, again.
        after_cursor = [end for end in ended if end.ended_at >= cursor]
        final_after = {}
        for end in after_cursor:
            item = self._item_of(end)
            status, _, standing = self._state(self._known(item))
            if item in self._final or status == "acked_final":
                final_after[item] = self._final.get(item, _flags(standing))
        record = orjson.dumps({"cursor": cursor, "counts": base, "open": [end.model_dump() for end in still_open.values()],
                               "recent": [end.model_dump() for end in after_cursor], "final_after": final_after,
                               "unended": unended, "log_from": log_from, "at": time.time(), "holder": self.holder,
                               "incarnation": getattr(self, "incarnation", None)})
        number = self._newest_checkpoint() + 1
        while not self.room.create(_checkpoint_name(self._root, number), record):
            number += 1  # Another rank's checkpoint took the number: the next one.
        self.room.barrier()  # Durable before the hint names it.
        self.room.put_hint(f"{self._root}/{_NEWEST_HINT}", str(number).encode())
        # What this process keeps in memory follows the cursor too.
        self._cursor, self._base = cursor, base
        for rollout_id in pruned:
            self._ends.pop(rollout_id, None)
        self._ended_sorted = [end for end in self._ended_sorted if end.rollout_id in self._ends]
        self._group_keys = {end.rollout_id: self._group_keys[end.rollout_id] for end in self._ended_sorted}
        live_items = {self._item_of(end) for end in self._ended_sorted}
        self._items = {item: known for item, known in self._items.items() if item in live_items}
        self._final = {item: flags for item, flags in self._final.items() if item in live_items}
        del self._log[: max(0, log_from - self._log_base)]
        self._log_base = max(self._log_base, log_from)
        self._started = {rollout_id: stamp for rollout_id, stamp in self._started.items() if stamp >= cursor}
        self._unended_carry = unended
        self._ended_elsewhere.clear()

    def rewind(self, step: int) -> None:
        """The trainer restarted from its checkpoint at ``step``: every ack at a later step that no
        commit made final is undone, and those rollouts are handed out again. (The leases earlier
        incarnations held were void from this consumer's start.)"""
        self._check_fenced()
        self._log_record({"kind": "rewind", "step": _step(step), "incarnation": self.incarnation})

    def _retire(self, item: str, members: list[str]) -> None:
        """The item's ack is final: its rollouts' token files are retired (``retires``)."""
        self._final.setdefault(item, 0)  # (An ack of no step set it, with its flags.)
        if not self.retires:
            return
        from ..contract import TokenFiles

        assert isinstance(self.room, DirectoryRoom)  # Refused for a store at the start.
        files = TokenFiles(self.room.directory)
        for rollout_id in members:
            if os.path.exists(files.path(rollout_id, ".tokens.state.json")) or os.path.exists(files.path(rollout_id)):
                files.retire(rollout_id)

    def _log_record(self, record: dict[str, Any]) -> None:
        while True:
            self._read_log()
            if self.room.create(f"{self._root}/log/{self._log_position() + 1:010d}.json",
                                orjson.dumps({**record, "at": time.time(), "holder": self.holder})):
                self.room.barrier()
                self._read_log()
                return
            time.sleep(0.001)  # Another holder's record is there (or being written): read it, try the next.

def _group_item(key: str) -> str:
    """A group's item (its log's name): `_GROUP_ITEM` and a digest of the key (a key is any text)."""
    return _GROUP_ITEM + hashlib.sha256(key.encode()).hexdigest()[:32]


def _checkpoint_name(root: str, number: int) -> str:
    return f"{root}/{_CHECKPOINTS}/{number:010d}.json"


def consumer_names(captures: object) -> list[str]:
    """The consumer names with state in the captures (a directory, a `CaptureStore`, a store URL)."""
    room = _room(captures, "consumer_names")
    if isinstance(room, StoreRoom):
        found = {name.split("/")[1] for name in room.store.names("consumers") if name.count("/") >= 2}
    else:
        found = set(room.names("consumers"))
    return sorted(name for name in found if is_valid_rollout_id(name))


def consumer_view(captures: object, name: str, unended_seconds: float = 300.0) -> _ConsumerView:
    """A consumer name's state, to look at (`counts`, `unended`, `oldest_waiting`): nothing is written."""
    view = _ConsumerView(_room(captures, "consumer_view"), name)
    view.unended_seconds = unended_seconds
    return view


def _room(captures: object, taker: str) -> Room:
    """Where the captures are: a store URL (its objects), else a directory."""
    if isinstance(captures, str) and is_store_url(captures):
        return StoreRoom(captures)
    return DirectoryRoom(directory_of(capture_store(captures, taker), taker))


def _weight_versions_of(directory: str, rollout_id: str, declared: list[str]) -> Optional[dict[str, Any]]:
    """Which weights generated the rollout's tokens: from its token records (the token capture
    mode), else from the versions on its capture lines (the engine's, or those the trainer
    declared), with the source said (``token_records`` / ``lines``)."""
    tokens: dict[str, int] = {}
    for record in read_token_records(directory, rollout_id):
        for version in record.token_weight_versions or ():
            if version is not None:
                tokens[version] = tokens.get(version, 0) + 1
    source = "token_records"
    if not tokens:
        tokens, source = _line_weight_versions(directory, rollout_id), "lines"
    if not tokens:
        return None
    rank = version_rank(tokens, declared)
    placed = sorted((version for version in tokens if version in rank), key=rank.__getitem__)
    return {"start": placed[0] if placed else None, "min": placed[0] if placed else None,
            "max": placed[-1] if placed else None, "tokens": tokens, "source": source}


def _line_weight_versions(directory: str, rollout_id: str) -> dict[str, int]:
    """Tokens per version from the capture lines' ``weight_versions`` (per choice, spans over its
    output; an open span closed at the reply's output count, else counted as one token), side
    calls left out."""
    from ..store import CaptureStore  # (The lines, read whole once: only when no token record said.)

    tokens: dict[str, int] = {}
    for line in CaptureStore(directory).read_available(rollout_id).lines:
        per_choice = line.get("weight_versions")
        if type(per_choice) is not list or line.get("side_call"):
            continue
        usage = (line.get("response") or {}).get("usage") if type(line.get("response")) is dict else None
        generated = None
        if type(usage) is dict:
            generated = usage.get("completion_tokens", usage.get("output_tokens"))
        for spans in per_choice:
            closed = resolved_spans(spans, generated if type(generated) is int and len(per_choice) == 1 else None)
            if closed is not None:
                for version in token_versions(closed, closed[-1]["end"] if closed else 0):
                    if version is not None:
                        tokens[version] = tokens.get(version, 0) + 1
            elif type(spans) is list:  # The output's length unknown: each version that generated some, once.
                for span in spans:
                    if type(span) is dict and type(span.get("version")) is str:
                        tokens[span["version"]] = tokens.get(span["version"], 0) + 1
    return tokens


#: An ack's flags as kept for a final item (in checkpoints): dropped, handed out stale, in a partial group.
_FLAG_NAMES = ((1, "dropped"), (2, "stale"), (4, "partial"))


def _flags(ack: Optional[dict[str, Any]]) -> int:
    return sum(bit for bit, key in _FLAG_NAMES if ack and ack.get(key))


def _task_index(rollout_id: str) -> str:
    """``<task>-<i>`` of a Gym id (what a partial group's ``missing`` names by index), else the id."""
    member = gym_member(rollout_id)
    return f"{member[0]}-{member[1]}" if member is not None else rollout_id


def _superseded(rollout_ids: Iterable[str]) -> set[str]:
    """The Gym attempts ``<task>-<i>[-a<n>]`` of these ids with a later attempt among them."""
    latest: dict[tuple[str, int], tuple[int, str]] = {}
    attempts = []
    for rollout_id in rollout_ids:
        member = gym_member(rollout_id)
        if member is not None:
            attempts.append((member, rollout_id))
            latest[member[:2]] = max(latest.get(member[:2], (-1, "")), (member[2], rollout_id))
    return {rollout_id for member, rollout_id in attempts if latest[member[:2]][1] != rollout_id}


def _step(step: Any) -> int:
    if type(step) is not int or step < 0:
        raise ValueError("step must be a non-negative integer")
    return step
