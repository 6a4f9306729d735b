"""The durable appender: one capture line, all or nothing, on disk before it returns (DESIGN §3).

``O_APPEND`` + ``flock(LOCK_EX)`` + one ``write`` + ``fsync``. The lock is taken on the file
itself, so rollouts never wait on each other while several writers (threads, processes, nodes on a
shared filesystem with POSIX locks) may append to one file. Blocking: run it off the event loop.
"""

from __future__ import annotations

import fcntl
import os
import time

# Read access too: the last byte is checked before appending (see `_terminate_torn_line`).
_OPEN_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
_FILE_MODE = 0o644


def append_capture_line(path: str, line: bytes) -> float:
    """Append ``line`` (one ``\\n``-terminated JSON line) to ``path`` durably, or raise OSError.

    Returns the seconds the ``fsync`` took (for the sidecar's metrics). A failed write (full
    disk, file size limit) is rolled back with ``ftruncate`` while the lock is still held, so a
    failed append never leaves a torn line for readers to skip.
    """
    fd, created = append_unsynced(path, line)
    try:
        fsync_started = time.perf_counter()
        os.fsync(fd)
        fsync_seconds = time.perf_counter() - fsync_started
    finally:
        os.close(fd)
    if created:
        # A new file's directory entry must be durable too, or a crash can lose the whole file.
        _fsync_directory(os.path.dirname(path) or ".")
    return fsync_seconds


def append_unsynced(path: str, data: bytes) -> tuple[int, bool]:
    """Append ``data`` (whole lines) under ``LOCK_EX``, torn-line repair first; no fsync.

    Returns the open descriptor, which the caller makes durable and closes, and whether the
    file was new (then its directory entry needs an fsync too). The group committer syncs many
    of these with one barrier.
    """
    fd = os.open(path, _OPEN_FLAGS, _FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            size_before = os.fstat(fd).st_size
            _write_whole(fd, _terminate_torn_line(fd, size_before) + data, size_before)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    except BaseException:
        os.close(fd)
        raise
    return fd, size_before == 0


def create_incomplete_marker(path: str) -> None:
    """Create the empty ``.capture.incomplete`` marker (idempotent)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), _FILE_MODE)
    os.close(fd)


def _terminate_torn_line(fd: int, size: int) -> bytes:
    """A newline when the file ends mid-line (an earlier writer crashed mid-write), else nothing.

    The torn fragment then stays a line of its own, which the tolerant reader skips and reports,
    instead of swallowing the line appended after it.
    """
    if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
        return b"\n"
    return b""


def _write_whole(fd: int, line: bytes, size_before: int) -> None:
    """One ``write`` of the whole line; if the kernel takes only part of it (a file-size limit or
    a nearly full disk), the rest is written under the same lock, and a failure rolls it all back
    and raises the real error (EFBIG, ENOSPC, ...)."""
    view = memoryview(line)
    try:
        while view:
            written = os.write(fd, view)
            if written <= 0:
                raise OSError(f"write made no progress after {len(line) - len(view)} of {len(line)} bytes")
            view = view[written:]
    except OSError:
        _roll_back(fd, size_before)
        raise


def _roll_back(fd: int, size_before: int) -> None:
    try:
        os.ftruncate(fd, size_before)
    except OSError:
        pass  # Nothing more can be done; the tolerant reader skips a torn last line.


def _fsync_directory(directory: str) -> None:
    try:
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
