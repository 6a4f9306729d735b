"""A capture store's writer states how far its lines have shipped: the live hand-off's watermark
(docs/reading.md, "Consuming from a capture store").

A consumer hands a rollout out only once every call acknowledged before its end is readable in
the store, including calls made through other sidecars (a re-pinned session), whose lines wait in
those sidecars' spools for the next segment seal. So each sidecar's uploader, on every round:

1. lists the store's ends from its cursor on (the end index, ``end-index/``: only the ends of the
   last `INDEX_LAG_SECONDS` and those since, never the run's history), noting the time it began:
   its **watermark** (every end whose put had completed by then is in the listing);
2. marks each end it had not seen in its spool (`records.contract.mark_ended_in_spool`: the rollout's
   token files frozen, its later calls refused here);
3. finds the ended rollouts it still **holds**: lines in an open segment (read as they grow), in a
   sealed segment not yet uploaded (its index), or token files changed since they were shipped;
   asks the writer to seal an open segment holding one (`SEAL_REQUEST`), and ships them at once
   (lines and token files: not at the next seal, nor after ``token_idle``);
4. puts ``writers/<spool_id>.json``: ``{"watermark", "holding", "seen", "stopped", "at"}``, where
   ``seen`` names the ends first seen in the last `SEEN_SECONDS` (an end put just before the
   listing began may be missing from it: ``seen`` is what vouches for those).

A writer is known before its sidecar takes a call: the sidecar puts the spool's writer object
(`announce_writer`: watermark 0, nothing seen) before it serves, so a consumer waits for this
writer's first round instead of handing out a rollout whose lines it has not shipped yet (before,
a rollout ended within a new sidecar's first second went out short of that sidecar's calls).

A consumer takes a rollout ended at ``E`` once, for every writer, it is not in ``holding`` and it
is in ``seen`` or the watermark is past ``E + SEEN_SECONDS`` (`records.contract.rollout_readiness`): the writer has seen its end and
shipped all it held of it. Clocks of the sidecars' nodes are taken to agree within seconds.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Optional

import orjson

from records.contract import END_INDEX, INDEX_LAG_SECONDS, ObjectStore, end_object_name, index_entries_after
from records.contract.writing import SEEN_SECONDS, ended_in_spool, mark_ended_in_spool, writer_object_name

from ._segments import OPEN_SUFFIX, ROLLOUTS_SUFFIX, SEAL_REQUEST, SEALED_SUFFIX, SEGMENTS, read_rollouts_index

#: How long a round waits for the writer to seal a segment it was asked to (its sweep: 0.25 s).
_SEAL_WAIT_SECONDS = 1.0


class Watermark:
    """One spool's part of the hand-off: what it holds of ended rollouts, and its watermark object."""

    def __init__(self, spool_dir: str, store: ObjectStore, spool_id: str) -> None:
        self.spool_dir = spool_dir
        self.store = store
        self.spool_id = spool_id
        #: Every end seen (ids), and when each was first seen.
        self._seen: dict[str, float] = {}
        #: Open segments read so far: path -> (bytes read, rollouts in them).
        self._open: dict[str, tuple[int, set[str]]] = {}
        #: Sealed segments' rollouts, by path (an index never changes).
        self._sealed: dict[str, list[str]] = {}
        self.watermark = 0.0
        #: Ends stamped from here on are listed each round (None: read from the spool at the first).
        self._listed_from: Optional[float] = None
        self.holding: set[str] = set()
        #: Every rollout (ended or not) with lines in the spool not uploaded, or a call in flight.
        self.pending: set[str] = set()

    def follow_ends(self) -> list[str]:
        """List the store's ends from this spool's cursor on (the end index: `records.contract.
        index_entries_after`; the watermark is when the listing began); mark the new ones in the
        spool. The ends first seen now. What a round reads grows with the ends of the last
        `INDEX_LAG_SECONDS` and those since the last round, never with the run: the cursor is kept
        in the spool (a new spool lists the index whole once, to refuse late calls of old ends)."""
        began = time.time()
        if self._listed_from is None:
            self._listed_from = _read_cursor(self.spool_dir)
        entries = [(stamp, rollout_id) for stamp, rollout_id in index_entries_after(self.store, END_INDEX, self._listed_from)
                   if rollout_id not in self._seen]
        # An entry stands for an end only once the end is there (it is written first: docs/reading.md).
        found = self.store.get_many([end_object_name(rollout_id) for _, rollout_id in entries]) if entries else {}
        fresh = []
        for _, rollout_id in entries:
            if end_object_name(rollout_id) not in found or rollout_id in self._seen:
                continue  # Its end is being written (seen next round), or its writer died first (never).
            self._seen[rollout_id] = began
            fresh.append(rollout_id)
            if not ended_in_spool(self.spool_dir, rollout_id):
                mark_ended_in_spool(self.spool_dir, rollout_id)
        self.watermark = began
        cursor = began - INDEX_LAG_SECONDS
        if cursor - self._listed_from >= 1.0:
            self._listed_from = cursor
            _write_cursor(self.spool_dir, cursor)
        forget = began - 2 * (INDEX_LAG_SECONDS + SEEN_SECONDS)  # Marked in the spool: its mark says it.
        if len(self._seen) > 4096:
            self._seen = {rollout_id: at for rollout_id, at in self._seen.items() if at >= forget}
        return fresh

    def in_open_segments(self) -> set[str]:
        """The rollouts with lines in the spool's open segments (each read from where it was left)."""
        found: set[str] = set()
        paths = set()
        root = os.path.join(self.spool_dir, SEGMENTS)
        for writer in _listdir(root):
            for name in _listdir(os.path.join(root, writer)):
                if name.endswith(OPEN_SUFFIX):
                    paths.add(os.path.join(root, writer, name))
        for path in paths:
            offset, rollouts = self._open.get(path, (0, set()))
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except FileNotFoundError:
                continue  # Sealed meanwhile: its index says the same.
            end = data.rfind(b"\n") + 1  # Whole lines only: the rest is read again next round.
            for line in data[:end].split(b"\n"):
                rollout_id, tab, _ = line.partition(b"\t")
                if tab:
                    rollouts.add(rollout_id.decode("ascii", "replace"))
            self._open[path] = (offset + end, rollouts)
            found |= rollouts
        for path in list(self._open):
            if path not in paths:
                del self._open[path]
        return found

    def in_sealed_segments(self, sealed: list[str]) -> set[str]:
        """The rollouts with lines in the sealed segments not yet uploaded (``sealed``: their paths)."""
        found: set[str] = set()
        for path in sealed:
            rollouts = self._sealed.get(path)
            if rollouts is None:
                try:
                    with open(path[: -len(SEALED_SUFFIX)] + ROLLOUTS_SUFFIX, "rb") as handle:
                        rollouts = read_rollouts_index(handle.read())[0]
                except FileNotFoundError:  # Left open by a crash, sealed by the next start: read it.
                    try:
                        with open(path, "rb") as handle:
                            rollouts = sorted({line.partition(b"\t")[0].decode("ascii", "replace")
                                               for line in handle.read().split(b"\n") if b"\t" in line})
                    except FileNotFoundError:
                        continue
                self._sealed[path] = rollouts
            found.update(rollouts)
        for path in list(self._sealed):
            if path not in sealed:
                del self._sealed[path]
        return found

    def ended(self, rollouts: set[str]) -> set[str]:
        return {rollout_id for rollout_id in rollouts
                if rollout_id in self._seen or ended_in_spool(self.spool_dir, rollout_id)}

    def seal_open_segments(self) -> None:
        """Ask every writer of the spool with an open segment to seal it now, and wait (a moment)
        for the seals."""
        waiting = []
        for path in self._open:
            directory = os.path.dirname(path)
            try:
                with open(os.path.join(directory, SEAL_REQUEST), "wb"):
                    pass
            except FileNotFoundError:
                continue
            waiting.append(path)
        deadline = time.monotonic() + _SEAL_WAIT_SECONDS
        while waiting and time.monotonic() < deadline:
            time.sleep(0.02)
            waiting = [path for path in waiting if os.path.exists(path)]

    def publish(self, stopped: bool = False) -> None:
        """Put this spool's watermark object."""
        now = time.time()
        seen = sorted(rollout_id for rollout_id, at in self._seen.items() if now - at <= SEEN_SECONDS)
        self.store.put(writer_object_name(self.spool_id), orjson.dumps(
            {"spool": self.spool_id, "watermark": self.watermark, "holding": sorted(self.holding), "seen": seen,
             "pending": sorted(self.pending), "stopped": stopped, "at": now}))


#: In a spool: the stamp its uploader lists the store's end index from.
_CURSOR = ".ends-listed-from"


def _read_cursor(spool_dir: str) -> float:
    try:
        with open(os.path.join(spool_dir, _CURSOR), encoding="ascii") as handle:
            return float(handle.read().strip() or 0.0)
    except (FileNotFoundError, ValueError):
        return 0.0


def _write_cursor(spool_dir: str, stamp: float) -> None:
    """Kept with a rename (a torn write would be read as 0: the index listed whole once)."""
    path = os.path.join(spool_dir, _CURSOR)
    part = f"{path}.{os.getpid()}.part"
    try:
        with open(part, "w", encoding="ascii") as handle:
            handle.write(repr(stamp))
        os.replace(part, path)
    except OSError:
        pass


def spool_id(spool_dir: str) -> str:
    """The spool's own id, kept in it (``.spool-id``): its writer object's and token files' name in
    the store, across restarts on the same spool."""
    path = os.path.join(spool_dir, ".spool-id")
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        pass
    part = f"{path}.{uuid.uuid4().hex}.part"  # Each process its own: several workers share a spool.
    with open(part, "w", encoding="ascii") as handle:
        handle.write(uuid.uuid4().hex[:16])
    try:
        os.link(part, path)  # The first to name it wins; the others read its name.
    except FileExistsError:
        pass
    finally:
        os.unlink(part)
    with open(path, encoding="ascii") as handle:
        return handle.read().strip()


def announce_writer(spool_dir: str, store_url: str, timeout: float) -> Optional[str]:
    """Put the spool's writer object as a writer that has seen nothing yet (watermark 0): every
    consumer waits on it for any end until its uploader's first round says what it holds. Called
    before the sidecar serves. Within ``timeout`` seconds (a store that is down never stops the
    sidecar from serving); what went wrong, or None."""
    outcome: dict[str, Optional[str]] = {"problem": "the store did not answer within %g s" % timeout}

    def put() -> None:
        try:
            now = time.time()
            identity = spool_id(spool_dir)
            ObjectStore(store_url).put(writer_object_name(identity), orjson.dumps(
                {"spool": identity, "watermark": 0.0, "holding": [], "seen": [], "pending": [], "stopped": False,
                 "at": now}))
            outcome["problem"] = None
        except Exception as exc:  # The store's refusal: said by the caller, never a failed start.
            outcome["problem"] = f"{type(exc).__name__}: {exc}"[:500]

    thread = threading.Thread(target=put, name="mcc-announce-writer", daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome["problem"]


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


__all__ = ["Watermark", "announce_writer", "spool_id"]
