"""Capture files kept open between appends, for the group committer (docs/files.md, issue 5).

Appending a batch's lines to a file used to take seven syscalls: open (a path lookup), lock,
fstat, read of the last byte, write, unlock, close. With 64 rollouts appending at once that
per-file work cost about a third of the sidecar's capture-on throughput (measured: 64 rollouts vs
one). A file kept open takes four -- lock, fstat, write, unlock -- and the last-byte read (the
torn-line check) is skipped while the file still has the size this writer left it at.

A file unlinked since it was opened (`clear_model_call_captures` before a new dispatch) shows
``st_nlink == 0`` in that fstat and is opened again, so the line lands in the new file. Only
local filesystems report that reliably (NFS renames an open file it unlinks and keeps
``st_nlink`` at 1), so elsewhere every append opens the path afresh, as before. Nothing in this
project renames capture files; one renamed away while its rollout still runs would go on
receiving that rollout's lines for as long as it stays cached.

A descriptor leaves the cache least-recently-used first, and is closed once no barrier still
needs it: a batch's barrier fsyncs the descriptors its lines were appended through.

A descriptor also leaves it after `IDLE_SECONDS` without an append (`close_idle`), and every
cached one goes when an append meets a full disk or quota (then the append is tried once more):
a finished rollout's file that an operator moves away is unlinked but, held open, still takes its
space, so a disk freed that way would otherwise stay full until a restart (issue 30).
"""

from __future__ import annotations

import errno
import os
import resource
import threading
import time
from collections import OrderedDict

from records.contract.writing import append_to_open_file, open_capture_file

#: Filesystems whose fstat of an open, unlinked file reports ``st_nlink == 0``.
_REPORTS_UNLINKED = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs", "overlay"})
_MAX_CACHED = 256
#: A file without an append for this long is closed: a rollout's calls come seconds apart, and a
#: finished rollout's file must let go of its space soon after it is moved away.
IDLE_SECONDS = 5.0
#: The appends that fail for want of space: cached descriptors of unlinked files may hold it.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


def keeps_files_open_safely(fstype: str | None) -> bool:
    return fstype in _REPORTS_UNLINKED


class OpenFile:
    """One open capture file; ``holds`` counts the barriers that still need ``fd``."""

    __slots__ = ("end", "fd", "holds", "retired", "used")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        #: When the last append went through it (monotonic seconds).
        self.used = time.monotonic()
        #: The size this writer left the file at (None: unknown, check the last byte).
        self.end: int | None = None
        self.holds = 0
        self.retired = False


class OpenFiles:
    """Open capture files by path. `append` runs on one thread; `release` may run on another."""

    def __init__(self, keep_open: bool, capacity: int | None = None) -> None:
        self._keep_open = keep_open
        self._capacity = capacity if capacity is not None else _default_capacity()
        self._files: OrderedDict[str, OpenFile] = OrderedDict()
        self._lock = threading.Lock()  # Guards `holds`, `retired` and the closing of a descriptor.

    def append(self, path: str, data: bytes) -> tuple[OpenFile, bool]:
        """Append ``data`` (whole lines) to ``path`` under its lock, no fsync; the file (held
        until `release`) and whether this append created it. Raises OSError."""
        freed = False
        for _ in range(3):
            entry = self._entry(path)
            try:
                appended = append_to_open_file(entry.fd, data, entry.end)
            except OSError as exc:
                entry.end = None  # A part may be written: the next append repairs the torn line.
                if not self._keep_open:
                    self._retire(path, entry)
                if exc.errno in _NO_SPACE and not freed and self._files:
                    freed = True
                    self.close_all()  # Files moved away but held open may be what fills the disk.
                    continue
                raise
            if appended is None:  # Unlinked since it was opened: append to the new file.
                self._retire(path, entry)
                continue
            entry.end = appended[1]
            entry.used = time.monotonic()
            with self._lock:
                entry.holds += 1
            if not self._keep_open:
                self._retire(path, entry)  # Closed once its barrier releases it.
            return entry, appended[0] == 0
        raise OSError(errno.ENOENT, f"{path} was removed on each of three attempts to append to it")

    def release(self, entry: OpenFile) -> None:
        """A barrier is done with ``entry``'s descriptor."""
        with self._lock:
            entry.holds -= 1
            if entry.retired and entry.holds == 0:
                os.close(entry.fd)

    def close_idle(self, now: float | None = None) -> int:
        """Close the cached files without an append for `IDLE_SECONDS`; how many were closed."""
        limit = (time.monotonic() if now is None else now) - IDLE_SECONDS
        idle = [(path, entry) for path, entry in self._files.items() if entry.used < limit]
        for path, entry in idle:
            self._retire(path, entry)
        return len(idle)

    def close_all(self) -> None:
        for path, entry in list(self._files.items()):
            self._retire(path, entry)

    def __len__(self) -> int:
        return len(self._files)

    def _entry(self, path: str) -> OpenFile:
        entry = self._files.get(path)
        if entry is not None:
            self._files.move_to_end(path)
            return entry
        try:
            fd = open_capture_file(path)
        except OSError as exc:
            if exc.errno != errno.EMFILE or not self._files:
                raise
            self.close_all()  # Out of descriptors: give back every cached one, then try once more.
            fd = open_capture_file(path)
        entry = OpenFile(fd)
        if self._keep_open:
            self._files[path] = entry
            while len(self._files) > self._capacity:
                oldest_path, oldest = next(iter(self._files.items()))
                self._retire(oldest_path, oldest)
        return entry

    def _retire(self, path: str, entry: OpenFile) -> None:
        """Out of the cache; the descriptor is closed now, or by the last `release`."""
        if self._files.get(path) is entry:
            del self._files[path]
        with self._lock:
            entry.retired = True
            if entry.holds == 0:
                os.close(entry.fd)


def _default_capacity() -> int:
    """At most a quarter of the process's descriptor limit: clients and upstreams need the rest."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 32
    if soft == resource.RLIM_INFINITY:
        return _MAX_CACHED
    return max(1, min(_MAX_CACHED, soft // 4))
