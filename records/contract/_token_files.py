"""A rollout's training-token files, under NeMo Gym 0.7.0's store protocol (docs/tokens.md; Gym's
``nemo_gym/token_id_capture/store.py`` is the contract, this is our code for it):

- ``<id>.tokens.jsonl``: one entry per call (`records.contract._token_entries`), fsynced before the call's
  reply ends (the same promise as the capture line);
- ``<id>.tokens.lock``: ``flock``\\ ed around every write and read, so Gym's own store, other
  sidecar workers and readers never see half a write;
- ``<id>.tokens.state.json``: ``frozen`` / ``retired`` / ``incomplete``, a ``version``, and the
  index of the entries written (``entry_digests`` by call id, ``indexed_size``), replaced
  atomically. Every reader and writer brings the index up to the entries file's tail first
  (Gym's ``_sync_entry_index``), so the index on disk may lag: this writer replaces the state
  on a change of lifecycle only, not per entry (the index names every entry of the rollout: a
  rewrite per entry is quadratic in a long rollout, issue 34);
- ``<id>.tokens.intents``: the call ids dispatched (a call with an intent and no entry was lost:
  Gym masks the rollout);
- ``<id>.tokens.incomplete``: the call ids whose entry could not be written.

A rollout Gym froze (or retired) takes no more entries: a late one is kept as evidence in
``<id>.tokens.late.jsonl``, never lost and never mixed into the frozen snapshot.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import orjson

from ._appender import fsync_directory
from ._group_sync import GroupSync
from ._rollout_ids import validate_rollout_id
from ._routed_experts import EXPERTS_SUFFIX
from ._token_entries import check_token_entry

TOKENS_SUFFIX = ".tokens.jsonl"
_NEW_STATE = {"entry_digests": {}, "frozen": False, "incomplete": False, "indexed_size": 0, "retired": False,
              "snapshot_id": "", "version": 0}


class RolloutClosed(Exception):
    """The rollout was frozen or retired by its consumer: it takes no new calls."""


class TokenFiles:
    """The training-token files of one directory."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        #: Each rollout's state as this object last knew it (its index ahead of the file's), with
        #: the state file's identity then, None when there was none (`_state`): a rollout's state
        #: indexes every entry, so parsing it on every call of a long rollout is quadratic (issue
        #: 34). Another writer's replacement has another identity.
        self._states: dict[str, tuple[Optional[tuple[int, int, int]], dict[str, Any]]] = {}
        self._states_lock = threading.Lock()  # Calls of other rollouts prepare and commit on other threads.
        #: Intents and entries written at once by several threads, made durable by one barrier
        #: (issue 34): each call writes two, and every fsync is a journal commit of its own.
        self._sync = GroupSync(directory)

    def path(self, rollout_id: str, suffix: str = TOKENS_SUFFIX) -> str:
        return os.path.join(self.directory, validate_rollout_id(rollout_id) + suffix)

    # -- writing ---------------------------------------------------------------------------

    def begin_call(self, rollout_id: str, model_call_ids: list[str], durable: bool = True) -> str:
        """Durably note that these calls are about to be dispatched; `RolloutClosed` when frozen.
        With ``durable=False`` the note is written, not flushed: the caller makes the returned
        path durable (`wait_durable`, or a barrier of its own) before anyone sees the call's reply."""
        with self._locked(rollout_id):
            identity, state = self._state(rollout_id)
            if state.get("retired") or state.get("frozen"):
                raise RolloutClosed(f"rollout {rollout_id} is {'retired' if state.get('retired') else 'frozen'}")
            self._keep_state(rollout_id, identity, state)
            # Durable before the call is dispatched (Gym's protocol), by a barrier shared with the
            # intents other threads wrote meanwhile: one syncfs for all instead of an fsync each.
            path = self.path(rollout_id, ".tokens.intents")
            _append_durably(path, "".join(f"{i}\n" for i in model_call_ids).encode(), sync=False)
            if durable:
                self._sync.wait_durable(path)
            return path

    def wait_durable(self, path: str) -> None:
        """What was written to ``path`` (one of these files) is on disk; shares a barrier with the
        other threads waiting at once."""
        self._sync.wait_durable(path)

    def after_durable(self, path: str, done: "Callable[[Optional[OSError]], None]") -> None:
        """`wait_durable` without waiting: ``done(None)`` (or ``done(error)``) on the barrier's
        thread once ``path`` is on disk (`GroupSync.after_durable`)."""
        self._sync.after_durable(path, done)

    def append(self, entry: dict[str, Any]) -> str:
        """Write one entry durably: ``written``, ``same`` (this exact entry is already there) or
        ``late`` (the rollout is frozen or retired: kept in the late file). ValueError when the
        call id is already there with other content (the rollout is then marked incomplete)."""
        return self.append_indexed(entry)[0]

    def append_indexed(self, entry: dict[str, Any], unsynced: Optional[list[str]] = None
                       ) -> tuple[str, Optional[int], Optional[int]]:
        """`append`, and where a ``written`` entry's line starts and ends in the file (a reader
        that had read up to its start may take the entry as it is instead of reading it back).
        ``unsynced``: the entry is written but not made durable here; its file's path is added
        to the list, and the caller makes it durable before anyone is told (the capture line's
        barrier, issue 34)."""
        payload = orjson.dumps(entry, option=orjson.OPT_SORT_KEYS)
        rollout_id, call_id = entry["rollout_id"], entry["model_call_id"]
        with self._locked(rollout_id):
            identity, state = self._state(rollout_id)
            if state.get("retired") or state.get("frozen"):
                _append_durably(self.path(rollout_id, ".tokens.late.jsonl"), payload + b"\n")
                return "late", None, None
            # One descriptor for the tail's size and the append (issue 76: each syscall of a
            # writer thread is a wait for the GIL beside the event loop).
            path = self.path(rollout_id)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            try:
                size = os.fstat(fd).st_size
                self._index_tail(rollout_id, state, size=size)
                digest = hashlib.sha256(payload).hexdigest()
                known = state["entry_digests"].get(call_id)
                if known == digest:
                    self._keep_state(rollout_id, identity, state)
                    return "same", None, None
                if known is not None:
                    state.update(incomplete=True, version=state["version"] + 1)
                    self._write_state(rollout_id, state, durable=True)
                    raise ValueError(f"model call {call_id} of rollout {rollout_id} was written before with other content")
                size = state["indexed_size"]  # A torn tail was cut by the index (`_index_tail`).
                _write_all(fd, payload + b"\n")
            finally:
                os.close(fd)
            if size == 0:
                fsync_directory(self.directory)  # A new file's name is made durable here either way.
            state["indexed_size"] = size + len(payload) + 1
            if unsynced is None:
                self._sync.wait_durable(path)
            else:
                unsynced.append(path)
            state["entry_digests"][call_id] = digest
            # The entry's fsync is the promise. The state file is not replaced: whoever reads it
            # next (this writer, another, Gym's store) indexes the tail first.
            self._keep_state(rollout_id, identity, state)
            return "written", state["indexed_size"] - len(payload) - 1, state["indexed_size"]

    def mark_incomplete(self, rollout_id: str, model_call_id: str) -> None:
        """Durably note that a call's entry could not be written (the rollout is unsafe to train on)."""
        with self._locked(rollout_id):
            _, state = self._state(rollout_id)
            self._index_tail(rollout_id, state)
            if state.get("retired"):
                return
            state.update(incomplete=True, version=state.get("version", 0) + 1)
            self._write_state(rollout_id, state, durable=True)
            _append_durably(self.path(rollout_id, ".tokens.incomplete"), f"{model_call_id}\n".encode())

    def freeze(self, rollout_id: str) -> None:
        """Durably freeze the rollout (Gym's ``frozen`` state): it takes no new call and no new
        entry; one written late is kept apart as evidence (an ended rollout: `records.end_rollout`)."""
        self._mark(rollout_id, "frozen")

    def retire(self, rollout_id: str) -> None:
        """Durably mark the rollout ``retired`` (Gym's state): its consumer accepted it for good
        (`records.Consumer` with ``retires=True``); Gym's collectors may then remove it."""
        self._mark(rollout_id, "retired")

    def _mark(self, rollout_id: str, flag: str) -> None:
        with self._locked(rollout_id):
            _, state = self._state(rollout_id)
            self._index_tail(rollout_id, state)
            if state.get(flag) or state.get("retired"):
                return
            state.update({flag: True, "version": state.get("version", 0) + 1})
            self._write_state(rollout_id, state, durable=True)

    def delete(self, rollout_id: str) -> None:
        """Before a rollout id is dispatched again: its entries, intents, marks, state and late
        entries go (Gym's ``TokenCaptureStore.delete``); the lock file stays, so a writer that
        still holds it and a new one agree on one inode."""
        with self._locked(rollout_id):
            for suffix in (TOKENS_SUFFIX, ".tokens.incomplete", ".tokens.intents", ".tokens.state.json",
                           ".tokens.late.jsonl"):
                try:
                    os.unlink(self.path(rollout_id, suffix))
                except FileNotFoundError:
                    pass
            shutil.rmtree(self.path(rollout_id, EXPERTS_SUFFIX), ignore_errors=True)  # Its routed experts' objects.

    # -- reading ---------------------------------------------------------------------------

    def entries(self, rollout_id: str, offset: int = 0) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        """The entries from byte ``offset`` on, each with its offset, and where they end. A torn
        last line (a writer killed mid-write, never acknowledged) is left for later."""
        path = self.path(rollout_id)
        try:
            if os.stat(path).st_size == offset:  # Nothing appended: no lock, no read (issue 34).
                return [], offset
        except FileNotFoundError:
            return [], offset
        with self._locked(rollout_id, shared=True):
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except FileNotFoundError:
                return [], offset
        found, position = [], 0
        while True:
            end = data.find(b"\n", position)
            if end < 0:
                break
            line = data[position:end].strip()
            if line:
                found.append((offset + position, check_token_entry(orjson.loads(line))))
            position = end + 1
        return found, offset + position

    def entry_at(self, rollout_id: str, offset: int) -> dict[str, Any]:
        """The entry whose line starts at ``offset``."""
        with self._locked(rollout_id, shared=True), open(self.path(rollout_id), "rb") as handle:
            handle.seek(offset)
            return check_token_entry(orjson.loads(handle.readline()))

    def state(self, rollout_id: str, indexed: bool = True) -> dict[str, Any]:
        """The rollout's state as a reader sees it: the file's, its index brought up to the
        entries on disk (a copy of its own: the cache is the writer's). ``indexed=False``: the
        lifecycle flags alone are wanted, the index is left as the file has it (no entry parsed)."""
        with self._locked(rollout_id, shared=True):
            state = self._read_state(rollout_id)[1]
            if indexed:
                self._index_tail(rollout_id, state, cut_torn=False)
            return state

    def intents(self, rollout_id: str) -> list[str]:
        try:
            with open(self.path(rollout_id, ".tokens.intents"), "rb") as handle:
                return [line.decode() for line in handle.read().split() if line]
        except FileNotFoundError:
            return []

    # -- the protocol's parts ---------------------------------------------------------------

    @contextmanager
    def _locked(self, rollout_id: str, shared: bool = False) -> Iterator[None]:
        fd = os.open(self.path(rollout_id, ".tokens.lock"), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # Closing releases the lock.

    def _state(self, rollout_id: str) -> tuple[Optional[tuple[int, int, int]], dict[str, Any]]:
        """The rollout's state file's identity and state (under its lock). The caller owns the
        dict: the cached one is handed over (and taken back by `_keep_state` or `_write_state`), so
        a caller that fails half-way leaves no cache."""
        with self._states_lock:
            cached = self._states.pop(rollout_id, None)
        return self._read_state(rollout_id, cached)

    def _keep_state(self, rollout_id: str, identity: Optional[tuple[int, int, int]], state: dict[str, Any]) -> None:
        with self._states_lock:
            self._states[rollout_id] = (identity, state)
            if len(self._states) > _STATES_KEPT:
                self._states.pop(next(iter(self._states)))

    def _read_state(self, rollout_id: str,
                    cached: Optional[tuple[Optional[tuple[int, int, int]], dict[str, Any]]] = None
                    ) -> tuple[Optional[tuple[int, int, int]], dict[str, Any]]:
        """(the state file's identity, its state): ``cached`` when the file is still the one it
        was read from (or there still is none), else parsed; a new state when there is no file."""
        try:
            with open(self.path(rollout_id, ".tokens.state.json"), "rb") as handle:
                identity = _identity(os.fstat(handle.fileno()))
                if cached is not None and cached[0] == identity:
                    return cached
                state = orjson.loads(handle.read())
        except FileNotFoundError:
            if cached is not None and cached[0] is None:
                return cached
            return None, {**_NEW_STATE, "entry_digests": {}}
        if not isinstance(state, dict):
            raise ValueError(f"the token state of rollout {rollout_id} is not a JSON object")
        return identity, state

    def _index_tail(self, rollout_id: str, state: dict[str, Any], cut_torn: bool = True,
                    size: Optional[int] = None) -> None:
        """Index entries written after the state was (by a writer that does not replace the state
        per entry, or stopped between its two writes), and cut a torn last line, which nobody was
        told was written (``cut_torn``: a writer's, under the exclusive lock). ``size``: the
        entries file's, when the caller has it open."""
        path = self.path(rollout_id)
        if size is None:
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                size = 0
        digests = state.setdefault("entry_digests", {})
        indexed: int = state["indexed_size"] if isinstance(state.get("indexed_size"), int) else 0
        if indexed == size:
            return
        with open(path, "rb") as handle:
            handle.seek(indexed)
            tail = handle.read()
        position = 0
        while position < len(tail):
            end = tail.find(b"\n", position)
            if end < 0:
                if cut_torn:
                    os.truncate(path, indexed + position)
                break
            line = tail[position:end].strip()
            if line:
                digests[check_token_entry(orjson.loads(line))["model_call_id"]] = hashlib.sha256(line).hexdigest()
            position = end + 1
        state["indexed_size"] = indexed + position

    def _write_state(self, rollout_id: str, state: dict[str, Any], durable: bool) -> None:
        """Replace the state file atomically: a new file, then a rename. The new file is named for
        the rollout, this process and this thread: two writers of one name would be one thread, or
        two processes (in two containers: pids repeat) writing one rollout under its lock at once."""
        payload = orjson.dumps(state, option=orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE)
        target = self.path(rollout_id, ".tokens.state.json")
        staging = os.path.join(self.directory, f".{rollout_id}.tokens-state-{os.getpid()}-{threading.get_ident()}.tmp")
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            try:
                _write_all(fd, payload)
                if durable:
                    os.fsync(fd)
                identity = _identity(os.fstat(fd))  # A rename keeps the inode, size and mtime.
            finally:
                os.close(fd)
            os.replace(staging, target)
        except BaseException:
            try:
                os.unlink(staging)
            except FileNotFoundError:
                pass
            raise
        self._keep_state(rollout_id, identity, state)
        if durable:
            fsync_directory(self.directory)


#: Rollouts whose state `TokenFiles` keeps parsed (each a few KB: an index of its entries).
_STATES_KEPT = 1024


def _identity(status: os.stat_result) -> tuple[int, int, int]:
    """What changes when the state file is replaced (each write is a new file, then a rename)."""
    return status.st_ino, status.st_mtime_ns, status.st_size


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _append_durably(path: str, data: bytes, sync: bool = True) -> int:
    """Append and fsync (``sync=False``: the caller makes the data durable; a new file's name is
    made durable here either way); the file's size after."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        before = os.fstat(fd).st_size  # Under the rollout's lock: nobody else appends meanwhile.
        _write_all(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    if before == 0:
        fsync_directory(os.path.dirname(path) or ".")
    return before + len(data)
