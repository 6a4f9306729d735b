"""Writer segments (docs/files.md, issue 46): a process appends every rollout's lines to files it owns.

The per-rollout file (docs/files.md) needs locks and appends that work across every node that writes it; a
segment needs neither. Each appending process (the capture process, or the writer threads where
it cannot run) has a writer id of its own and appends to one open segment under the spool,
``<spool>/segments/<writer_id>/<seq>.open``; each line is the rollout id, a tab, and the capture
line's own bytes (a rollout id never holds a tab: `records.ROLLOUT_ID_PATTERN`). The same
durability: the batch's barrier fsyncs the segment before its terminals are released.

A segment is sealed when it reaches ``max_bytes`` or ``max_age`` seconds, or when its process
ends: once no barrier still needs it, it is renamed ``<seq>.sealed`` (and the rename made
durable), and is never written again; the uploader (`proxy.app`'s, `capture.journal._upload`)
takes it from there. A segment left ``.open`` by a process that died is sealed by the next one
to start on the spool (`seal_leftovers`): its acknowledged lines are in it, fsynced, and a torn
last line (a crash mid-write) is skipped by every reader.

`SegmentFiles` has `OpenFiles`' interface, so the capture process and the group committer append
to segments as they append to rollout files.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Optional

import orjson

from records.contract import CAPTURE_SUFFIX, fsync_directory

from ._open_files import OpenFile

OPEN_SUFFIX = ".open"
#: ``<spool>/segments/<writer_id>/.seal``: the uploader asks the writer to seal its open segment
#: now (it holds lines of an ended rollout a consumer waits for: `capture.journal._watermark`).
SEAL_REQUEST = ".seal"
SEALED_SUFFIX = ".sealed"
SEGMENTS = "segments"


@dataclass(frozen=True)
class SegmentPolicy:
    """Where segments are spooled and when one is sealed."""

    spool_dir: str
    max_bytes: int = 64 * 1024 * 1024
    max_age: float = 60.0

    def as_argument(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_argument(cls, text: str) -> "SegmentPolicy":
        return cls(**json.loads(text))


def new_writer_id() -> str:
    """Unique to one appending process: its host, its pid, and a random part (pids are reused)."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:40] or "host"
    return f"{host}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


#: Held (``flock``, exclusive) by a writer for as long as it lives: the kernel lets go when the
#: process ends, however it ends. A pid is no proof: a restarted container's process has the pid
#: the dead one had.
ALIVE_FILE = ".alive"


def writer_alive(directory: str) -> bool:
    """Whether the writer of ``directory`` still runs: its ``.alive`` lock is held (the spool is on
    this node's own disk, where ``flock`` is what it says)."""
    try:
        fd = os.open(os.path.join(directory, ALIVE_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # Closing lets go of a lock taken just now.
    return False


ROLLOUTS_SUFFIX = ".rollouts"
#: A line's top-level ``completed_at`` as our own encoder writes it: after ``model_ref``'s fixed
#: keys, so its first match is the top-level one (an escaped string never holds ``"...":``).
_COMPLETED_AT = re.compile(rb'"completed_at":\s*(-?[0-9][0-9.eE+-]*|null)')
#: How far into a line ``completed_at`` is looked for (it is among the first fields).
_COMPLETED_AT_WITHIN = 4096


class _Segment:
    __slots__ = ("path", "entry", "opened", "size", "order", "whole")

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.entry = OpenFile(fd)
        self.opened = time.monotonic()
        self.size = 0
        #: Each rollout it holds lines of, with their ``completed_at`` (JSON text) in append order:
        #: the manifest's (the uploader need not parse the segment; readers place lines by it).
        self.order: dict[bytes, list[bytes]] = {}
        #: No append to it failed part-way: every line in it is whole, as the order says.
        self.whole = True


class SegmentFiles:
    """This process's open segment, behind `OpenFiles`' interface: `append` takes the rollout's
    capture path (``<dir>/<rollout_id>.capture.jsonl``) and its whole lines."""

    def __init__(self, policy: SegmentPolicy) -> None:
        self.policy = policy
        self.writer_id = new_writer_id()
        self.directory = os.path.join(policy.spool_dir, SEGMENTS, self.writer_id)
        os.makedirs(self.directory, exist_ok=True)
        self._seal_request = os.path.join(self.directory, SEAL_REQUEST)
        # Alive from here on, for as long as this process lives (`writer_alive`).
        self._alive = os.open(os.path.join(self.directory, ALIVE_FILE), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self._alive, fcntl.LOCK_EX)
        self._sequence = 0
        self._current: Optional[_Segment] = None
        #: Sealed segments some barrier still holds: renamed when the last lets go.
        self._sealing: dict[int, _Segment] = {}
        self._lock = threading.Lock()

    def append(self, path: str, data: bytes) -> tuple[OpenFile, bool]:
        return self.append_batch([(path, data)])

    def append_batch(self, appends: list[tuple[str, bytes]]) -> tuple[OpenFile, bool]:
        """Every rollout's lines of a batch (``(capture path, whole lines)``) in one write: one
        file, so the batch's barrier is one fsync (not a syncfs of the filesystem)."""
        pieces = []
        order: list[tuple[bytes, list[bytes]]] = []
        for path, data in appends:
            rollout_id = os.path.basename(path)[: -len(CAPTURE_SUFFIX)].encode()
            prefix = rollout_id + b"\t"
            lines = data.split(b"\n")
            if lines[-1]:
                raise ValueError("a capture append is whole lines, each ending in a newline")
            del lines[-1]
            pieces += [prefix + line + b"\n" for line in lines]
            order.append((rollout_id, [_completed_at(line) for line in lines]))
        payload = b"".join(pieces)
        segment = self._current if self._current is not None else self._open_next()
        entry = segment.entry
        if entry.end is None:  # An append failed part-way: the torn line ends here, alone.
            payload = b"\n" + payload
            segment.whole = False
        _write_all(entry.fd, payload, segment)
        for rollout_id, values in order:
            segment.order.setdefault(rollout_id, []).extend(values)
        entry.end = segment.size
        entry.used = time.monotonic()
        with self._lock:
            entry.holds += 1
        if segment.size >= self.policy.max_bytes:
            self._seal_current()
        return entry, False

    def release(self, entry: OpenFile) -> None:
        with self._lock:
            entry.holds -= 1
            segment = self._sealing.get(entry.fd) if entry.retired and entry.holds == 0 else None
            if segment is not None:
                del self._sealing[entry.fd]
        if segment is not None:
            self._finish_sealing(segment)

    def close_idle(self, now: Optional[float] = None) -> int:
        """Seal the open segment once it is ``max_age`` old, or when the uploader asked for it (an
        ended rollout's lines are in it: `SEAL_REQUEST`); called on the writer's sweep."""
        current = self._current
        requested = os.path.exists(self._seal_request)
        if requested:
            try:
                os.unlink(self._seal_request)
            except FileNotFoundError:
                pass
        if current is not None and (requested or (time.monotonic() if now is None else now) - current.opened
                                    >= self.policy.max_age):
            self._seal_current()
            return 1
        return 0

    def close_all(self) -> None:
        """Seal the open segment (the process ends, or a full disk: a fresh one is opened next)."""
        if self._current is not None:
            self._seal_current()

    def __len__(self) -> int:
        return 1 if self._current is not None else 0

    def _open_next(self) -> _Segment:
        self._sequence += 1
        path = os.path.join(self.directory, f"{self._sequence:010d}{OPEN_SUFFIX}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o644)
        fsync_directory(self.directory)  # The new file's entry is durable before any line in it is acknowledged.
        self._current = _Segment(path, fd)
        self._current.entry.end = 0  # Empty, made here: no torn line to end.
        return self._current

    def _seal_current(self) -> None:
        segment, self._current = self._current, None
        if segment is None:
            return
        with self._lock:
            segment.entry.retired = True
            held = segment.entry.holds > 0
            if held:
                self._sealing[segment.entry.fd] = segment
        if not held:
            self._finish_sealing(segment)

    def _finish_sealing(self, segment: _Segment) -> None:
        """No barrier needs it: fsynced, closed, renamed sealed (durably); empty ones removed."""
        fd = segment.entry.fd
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if segment.size == 0:
            os.unlink(segment.path)
            return
        base = segment.path[: -len(OPEN_SUFFIX)]
        with open(base + ROLLOUTS_SUFFIX, "wb") as handle:  # Before the rename: a sealed one always has it.
            # ``<rollout_id>\t<completed_at>,...`` a line; after an append that failed part-way,
            # the rollouts alone (the uploader then reads the order from the segment's whole lines).
            handle.write(b"\n".join(rollout_id + b"\t" + b",".join(values) if segment.whole else rollout_id
                                     for rollout_id, values in sorted(segment.order.items())))
        os.rename(segment.path, base + SEALED_SUFFIX)
        fsync_directory(os.path.dirname(segment.path))


def seal_leftovers(spool_dir: str) -> int:
    """Seal the segments left open by processes that are gone (a crash, a SIGKILL); how many."""
    root = os.path.join(spool_dir, SEGMENTS)
    sealed = 0
    try:
        writers = os.listdir(root)
    except FileNotFoundError:
        return 0
    for writer_id in writers:
        directory = os.path.join(root, writer_id)
        if not os.path.isdir(directory) or writer_alive(directory):
            continue
        for name in os.listdir(directory):
            if name.endswith(OPEN_SUFFIX):
                path = os.path.join(directory, name)
                if os.path.getsize(path) == 0:
                    os.unlink(path)
                    continue
                os.rename(path, path[: -len(OPEN_SUFFIX)] + SEALED_SUFFIX)
                sealed += 1
        fsync_directory(directory)
    return sealed


def sealed_segments(spool_dir: str) -> list[str]:
    """Every sealed segment in the spool, oldest first per writer (its sequence), writers by name."""
    root = os.path.join(spool_dir, SEGMENTS)
    found = []
    try:
        writers = sorted(os.listdir(root))
    except FileNotFoundError:
        return []
    for writer_id in writers:
        directory = os.path.join(root, writer_id)
        if os.path.isdir(directory):
            found += [os.path.join(directory, name) for name in sorted(os.listdir(directory))
                      if name.endswith(SEALED_SUFFIX)]
    return found


def _completed_at(line: bytes) -> bytes:
    """The line's top-level ``completed_at`` as JSON text (``null`` when it has none, or not a number),
    what a parse of the line gives. Our encoder writes it among the first fields: found there, at
    the object's own depth (its braces counted outside strings, when no escape makes that hard), it
    is taken as written; otherwise the line is parsed."""
    found = _COMPLETED_AT.search(line, 0, _COMPLETED_AT_WITHIN)
    if found is not None:
        prefix = line[: found.start()]
        if b"\\" not in prefix:
            outside = prefix.split(b'"')[::2]  # Without escapes, every other piece is a string's.
            if sum(piece.count(b"{") - piece.count(b"}") for piece in outside) == 1:
                return found.group(1)
    try:
        value = orjson.loads(line).get("completed_at")
    except (orjson.JSONDecodeError, AttributeError):
        return b"null"
    return orjson.dumps(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else b"null"


def read_rollouts_index(data: bytes) -> tuple[list[str], Optional[dict[str, list]]]:
    """A sealed segment's ``.rollouts``: its rollouts, and each one's lines' ``completed_at`` in
    append order (None when the writer could not vouch for every line being whole)."""
    rollouts, order = [], {}
    for entry in data.split(b"\n"):
        if not entry:
            continue
        rollout_id, tab, values = entry.partition(b"\t")
        rollouts.append(rollout_id.decode())
        if tab:
            order[rollout_id.decode()] = orjson.loads(b"[" + values + b"]")
    return sorted(rollouts), (order if len(order) == len(rollouts) else None)


def _write_all(fd: int, payload: bytes, segment: _Segment) -> None:
    view = memoryview(payload)
    while view:
        try:
            written = os.write(fd, view)
        except OSError:
            segment.entry.end = None
            raise
        if written == 0:
            segment.entry.end = None
            raise OSError(errno.EIO, "a write of a segment wrote nothing")
        segment.size += written
        view = view[written:]


__all__ = ["ALIVE_FILE", "OPEN_SUFFIX", "SEAL_REQUEST", "ROLLOUTS_SUFFIX", "SEALED_SUFFIX", "SEGMENTS", "SegmentFiles", "SegmentPolicy", "new_writer_id",
           "read_rollouts_index",
           "seal_leftovers", "sealed_segments", "writer_alive"]
