"""Where a consumer's state and the ends it reads live: a capture directory, or a capture store
(docs/reading.md, "Consuming rollouts during the run").

`records.Consumer` keeps one logic over both; a room gives it the few operations that differ:
read a record, create one exclusively, list names, make what was written durable, read the ends
and the rollouts' starts from a point in time on (the time indexes: `records.contract._time_index`),
say whether an ended rollout is whole yet, and give a directory to read a rollout's calls from.

- **Directory**: records are files; a create is ``O_EXCL`` (one create and one write: a record
  found empty is being written, or was left empty by a writer that died); durable at the
  operation's barrier (one ``syncfs``, else each file and directory fsynced). Ends are
  ``<rollout_id>.end.json`` beside the rollouts, found from ``end-index/``; a rollout is whole when
  it ends (every line is durable before its terminal is released).
- **Store**: records are objects; a create is a conditional put (``If-None-Match: *`` on S3, a
  hard link on ``segments://``), durable when it returns. Ends are ``ends/<rollout_id>.json``, found
  from ``end-index/`` (a listing with a start-after); a
  rollout is whole when every writer's watermark says so (`records.contract.rollout_readiness`); its calls
  are read from the store's view, rebuilt for the rollouts handed out.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, Callable, Optional

import orjson

from ..contract import fsync_directory
from ..contract import call_syncfs, filesystem_type, load_syncfs, syncfs_flushes
from ..contract import ObjectStore
from ..contract import RolloutEnd, end_object_name
from ..contract.reading import create_exclusively, end_path, read_end_file
from ..contract import END_INDEX, INDEX_LAG_SECONDS, START_INDEX, index_entries_after
from ..contract.reading import same_stamp
from ..contract.reading import declared_versions, declared_versions_in_store
from ..contract.reading import read_watermarks, rollout_readiness
from ..contract import CAPTURE_SUFFIX, read_in_flight
from ..contract.reading import in_flight_readiness, read_run_end, read_store_run_end


#: A directory's mtime may lag a create by up to a clock tick: within this of its mtime, list anyway.
_MTIME_GRANULARITY_NS = 50_000_000


class ExclusiveCreateBroken(RuntimeError):
    """The captures' storage does not keep a second create of one name from succeeding: a
    consumer's claims would not be exclusive there."""


class DirectoryRoom:
    """A capture directory."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.where = directory
        self._unsynced: list[str] = []
        self._syncfs: Any = None
        #: End index entries that stand for no end (`new_ends`).
        self._dead: set[tuple[float, str]] = set()
        #: The sidecars' calls in flight as of the last `look`.
        self._publications: list[dict[str, Any]] = []
        self._run_end: Optional[dict[str, Any]] = None

    def prepare(self, prefix: str) -> None:
        """Ready to write under ``prefix`` (``consumers/<name>``), with exclusive create checked."""
        root = os.path.join(self.directory, prefix)
        for part in ("items", "log", "checkpoints", "incarnations"):
            os.makedirs(os.path.join(root, part), exist_ok=True)
        probe = os.path.join(root, f".probe-{uuid.uuid4().hex}")
        try:
            if not create_exclusively(probe, b"{}") or create_exclusively(probe, b"{}"):
                raise ExclusiveCreateBroken(
                    f"{root}: creating one file twice did not fail the second time, so a consumer's claims would not "
                    "be exclusive there; use a filesystem with working hard links (a local disk, NFS v4)")
        finally:
            try:
                os.unlink(probe)
            except FileNotFoundError:
                pass
        self._syncfs = load_syncfs() if syncfs_flushes(filesystem_type(root)) else None

    def read(self, name: str) -> Optional[tuple[bytes, float]]:
        """A record's bytes and age in seconds, or None when there is none."""
        try:
            with open(os.path.join(self.directory, name), "rb") as handle:
                return handle.read(), time.time() - os.fstat(handle.fileno()).st_mtime
        except FileNotFoundError:
            return None

    def create(self, name: str, data: bytes) -> bool:
        """``data`` as the new record ``name``: False when it exists. One ``O_EXCL`` create and one
        write (a reader that finds it empty waits); durable at `barrier`."""
        path = os.path.join(self.directory, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        except FileExistsError:
            return False
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self._unsynced.append(path)
        return True

    def create_many(self, records: dict[str, dict[str, Any]]) -> set[str]:
        """Each of ``records`` (name -> record, all in one directory) created exclusively at once:
        one file holding them all, written once, then hard-linked to each name (a link fails when
        the name exists, as ``O_EXCL`` does); the names created. A reader of any of them finds
        its own record under ``records`` (`record_of`). Durable at `barrier`: a take or an ack of a
        training step's batch costs one write and a link per item, not a file each."""
        paths = {os.path.join(self.directory, name): name for name in records}
        created = _create_linked(paths, records)
        self._unsynced += [path for path, name in paths.items() if name in created]
        return created

    def names(self, prefix: str) -> list[str]:
        """The names of the records directly under ``prefix``."""
        try:
            return os.listdir(os.path.join(self.directory, prefix))
        except FileNotFoundError:
            return []

    def barrier(self) -> None:
        """What was created since the last barrier is durable: one ``syncfs`` where the filesystem
        honours it (`records.contract.syncfs_flushes`), else each file and directory fsynced."""
        written, self._unsynced = self._unsynced, []
        if not written:
            return
        if self._syncfs is not None:
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                failure = call_syncfs(self._syncfs, fd)
            finally:
                os.close(fd)
            if failure is None:
                return
        for path in written:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            fsync_directory(os.path.dirname(path))

    def new_ends(self, since: float, known: dict[str, RolloutEnd]) -> None:
        """Add the ends stamped at or after ``since`` that are not in ``known`` (ends never change:
        each read once), from the end index (`records.contract.index_entries_after`): what it
        reads grows with the ends since ``since``, never with the run."""
        _add_new_ends(index_entries_after(self.directory, END_INDEX, since), known, self._dead,
                      lambda ids: {rollout_id: end for rollout_id in ids
                                   if (end := read_end_file(end_path(self.directory, rollout_id))) is not None})

    def started_since(self, since: float) -> dict[str, float]:
        """The rollouts whose first line was written at or after ``since`` (the start index), with when."""
        return {rollout_id: stamp for stamp, rollout_id in index_entries_after(self.directory, START_INDEX, since)}

    def has_end(self, rollout_id: str) -> bool:
        return os.path.exists(end_path(self.directory, rollout_id))

    def last_written(self, rollout_id: str) -> Optional[float]:
        """When the rollout's capture file last changed, or None when it has none."""
        try:
            return os.stat(os.path.join(self.directory, rollout_id + CAPTURE_SUFFIX)).st_mtime
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.directory, name))

    def put_hint(self, name: str, data: bytes) -> None:
        """Overwrite a hint (a record that only saves reads: never trusted, so never made durable)."""
        path = os.path.join(self.directory, name)
        part = f"{path}.{uuid.uuid4().hex[:8]}.part"
        with open(part, "wb") as handle:
            handle.write(data)
        os.replace(part, path)

    def run_ended(self) -> Optional[dict[str, Any]]:
        if self._run_end is None:  # Once ended, the run stays ended.
            self._run_end = read_run_end(self.directory)
        return self._run_end

    def in_flight(self, end: RolloutEnd, bound: float) -> tuple[str, Optional[str]]:
        """The write barrier: ``ready``, ``wait`` or ``incomplete`` (with why) for an ended rollout,
        from the sidecars' publications of their calls in flight (`records.contract._calls_in_flight`)."""
        return in_flight_readiness(self._publications, end.rollout_id, end.ended_at, time.time(), bound)

    def read_many(self, prefix: str, names: list[str]) -> dict[str, bytes]:
        found = {}
        for name in names:
            record = self.read(f"{prefix}/{name}")
            if record is not None:
                found[name] = record[0]
        return found

    def look(self) -> None:
        """Before a take's readiness checks: the sidecars' calls in flight, read once (a store reads
        its writers' watermarks once here)."""
        self._publications = read_in_flight(self.directory)

    def readiness(self, end: RolloutEnd, writer_bound: float) -> str:
        return "ready"  # Every line is durable before its terminal, so before the end.

    def view(self, rollout_ids: list[str]) -> str:
        return self.directory

    def declared_versions(self) -> list[str]:
        return declared_versions(self.directory)


class StoreRoom:
    """A capture store."""

    def __init__(self, url: str) -> None:
        self.store = ObjectStore(url)
        self.where = self.store.url
        self._watermarks: list[dict[str, Any]] = []
        self._versions: dict[str, str] = {}
        self._created = False
        self._run_end: Optional[dict[str, Any]] = None
        self._dead: set[tuple[float, str]] = set()
        self._view_at: Optional[tuple[float, str]] = None

    def prepare(self, prefix: str) -> None:
        """Exclusive create checked where the consumer writes: a probe created twice must fail the
        second time (some S3-compatible servers take ``If-None-Match`` and ignore it)."""
        probe = f"{prefix}/probes/{uuid.uuid4().hex}.json"
        if not self.store.create(probe, b"{}") or self.store.create(probe, b"{}"):
            raise ExclusiveCreateBroken(
                f"{self.where}: creating one object twice with a conditional put (If-None-Match: *) did not fail the "
                "second time, so a consumer's claims would not be exclusive there; use a store that honours "
                "conditional writes (AWS S3, MinIO, GCS, Azure) or a shared directory")

    def read(self, name: str) -> Optional[tuple[bytes, float]]:
        data = self.store.get_if_present(name)
        return None if data is None else (data, 0.0)  # A put is whole: never found half-written.

    def create(self, name: str, data: bytes) -> bool:
        self._created = True
        return self.store.create(name, data, durable=False)

    def create_many(self, records: dict[str, dict[str, Any]]) -> set[str]:
        """Each created exclusively: on a ``segments://`` path as in a directory (one file, a hard
        link per name: `DirectoryRoom.create_many`), on an object store each by its own
        conditional put (an object store has no link); the names created."""
        local = {name: self.store.local_path(name) for name in records}
        paths = {path: name for name, path in local.items() if path is not None}
        if len(paths) < len(records) or len(records) < 2:
            return {name for name, record in records.items() if self.create(name, orjson.dumps(record))}
        os.makedirs(os.path.dirname(next(iter(paths))), exist_ok=True)
        self._created = True
        return _create_linked(paths, records)

    def names(self, prefix: str) -> list[str]:
        return [name.rpartition("/")[2] for name in self.store.names(prefix)]

    def barrier(self) -> None:
        """What was created since the last barrier is durable: nothing to do for an object store
        (a put is durable when it returns); one ``syncfs`` for a ``segments://`` path."""
        if self._created:
            self._created = False
            self.store.sync()

    def new_ends(self, since: float, known: dict[str, RolloutEnd]) -> None:
        """`DirectoryRoom.new_ends` from the store's end index: one listing with a start-after and
        the new ends fetched together."""
        def ends_of(ids: list[str]) -> dict[str, RolloutEnd]:
            found = self.store.get_many([end_object_name(rollout_id) for rollout_id in ids])
            return {name.rpartition("/")[2][: -len(".json")]: RolloutEnd.model_validate(orjson.loads(data))
                    for name, data in found.items()}

        _add_new_ends(index_entries_after(self.store, END_INDEX, since), known, self._dead, ends_of)

    def started_since(self, since: float) -> dict[str, float]:
        return {rollout_id: stamp for stamp, rollout_id in index_entries_after(self.store, START_INDEX, since)}

    def has_end(self, rollout_id: str) -> bool:
        return self.store.get_if_present(end_object_name(rollout_id)) is not None

    def last_written(self, rollout_id: str) -> Optional[float]:
        """The ``completed_at`` of the rollout's last line in the store's view (brought up to date at
        most once a second: `counts` asks this of every rollout under way), or None when it has none."""
        if self._view_at is None or time.monotonic() - self._view_at[0] > 1.0:
            self._view_at = (time.monotonic(), self.view([]))
        return _last_completed_at(os.path.join(self._view_at[1], rollout_id + CAPTURE_SUFFIX))

    def exists(self, name: str) -> bool:
        return self.store.get_if_present(name) is not None

    def put_hint(self, name: str, data: bytes) -> None:
        self.store.put(name, data)

    def read_many(self, prefix: str, names: list[str]) -> dict[str, bytes]:
        """The records of ``names`` under ``prefix`` that exist, fetched together."""
        found = self.store.get_many([f"{prefix}/{name}" for name in names])
        return {name.rpartition("/")[2]: data for name, data in found.items()}

    def look(self) -> None:
        self._watermarks = read_watermarks(self.store)

    def run_ended(self) -> Optional[dict[str, Any]]:
        if self._run_end is None:
            self._run_end = read_store_run_end(self.store)
        return self._run_end

    def in_flight(self, end: RolloutEnd, bound: float) -> tuple[str, Optional[str]]:
        """A store's write barrier is its writers' watermarks (`readiness`): a writer holds an ended
        rollout back while it has lines of it to ship."""
        return "ready", None

    def readiness(self, end: RolloutEnd, writer_bound: float) -> str:
        return rollout_readiness(self._watermarks, end.rollout_id, end.ended_at, time.time(), writer_bound)

    def view(self, rollout_ids: list[str]) -> str:
        """The store's view, brought up to date as every reader's is (`records.store.store_view`: only
        the rollouts that manifests listed since the last look name are rebuilt). Listed after the
        watermarks said these rollouts are whole, so it holds every line of theirs."""
        from ..store import store_view  # Only a store's readers fetch its segments.

        return store_view(self.store.url, allow_empty=True)  # Ends may come first.

    def declared_versions(self) -> list[str]:
        return declared_versions_in_store(self.store, self._versions)


def _create_linked(paths: dict[str, str], records: dict[str, dict[str, Any]]) -> set[str]:
    """Each of ``records`` (name -> record) as the file ``paths`` gives it (path -> name, all in one
    directory), created exclusively: one file holding them all, written once, then hard-linked to
    each path (a link fails when the path exists, as ``O_EXCL`` does); the names created. Durable
    at the caller's barrier."""
    if not paths:
        return set()
    directory = os.path.dirname(next(iter(paths)))
    temporary = os.path.join(directory, f".batch-{uuid.uuid4().hex}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        os.write(fd, orjson.dumps({"records": {os.path.basename(path): records[name] for path, name in paths.items()}}))
    finally:
        os.close(fd)
    created = set()
    try:
        for path, name in paths.items():
            try:
                os.link(temporary, path)
            except FileExistsError:
                continue
            created.add(name)
    finally:
        os.unlink(temporary)
    return created


def _add_new_ends(entries: list[tuple[float, str]], known: dict[str, RolloutEnd], dead: set[tuple[float, str]],
                  ends_of: Callable[[list[str]], dict[str, RolloutEnd]]) -> None:
    """The ends the index ``entries`` stand for, added to ``known``. An entry is written before its
    end (`records.contract.write_rollout_end`): one whose end is not there yet is looked at again
    next time, and stands for nothing (``dead``) once its end is another (a racing writer's won)
    or `INDEX_LAG_SECONDS` passed without it (its writer died before it, unanswered)."""
    fresh = [(stamp, rollout_id) for stamp, rollout_id in entries if rollout_id not in known and (stamp, rollout_id) not in dead]
    if not fresh:
        return
    found = ends_of(sorted({rollout_id for _, rollout_id in fresh}))
    now = time.time()
    for stamp, rollout_id in fresh:
        end = found.get(rollout_id)
        if end is not None and same_stamp(end.ended_at, stamp):
            known[rollout_id] = end
        elif end is not None or now - stamp > INDEX_LAG_SECONDS:
            dead.add((stamp, rollout_id))


def _last_completed_at(path: str) -> Optional[float]:
    """The ``completed_at`` of a capture file's last whole line (its tail read), or None."""
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - 65536))
            tail = handle.read()
    except FileNotFoundError:
        return None
    for line in reversed(tail.split(b"\n")):
        try:
            value = orjson.loads(line).get("completed_at")
        except (orjson.JSONDecodeError, AttributeError):
            continue
        if isinstance(value, (int, float)):
            return float(value)
    return os.stat(path).st_mtime  # A last line longer than the tail read: when the view last changed.


def record_of(name: str, parsed: Any) -> Any:
    """The record of ``name`` (a slot's file name) in what its file holds: itself, or its entry
    of a batch (`DirectoryRoom.create_many`)."""
    if isinstance(parsed, dict) and "records" in parsed and "kind" not in parsed:
        return parsed["records"].get(name.rpartition("/")[2])
    return parsed


__all__ = ["DirectoryRoom", "ExclusiveCreateBroken", "StoreRoom", "record_of"]
