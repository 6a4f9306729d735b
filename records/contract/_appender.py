"""The durable appender: one capture line, all or nothing, on disk before it returns (docs/files.md).

The write side of the file contract lives beside the read side (`records`), so the sidecar's
writer (`capture`), `CaptureStore.record` and the readers share one truth; `capture` builds its
group commit on these primitives.

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
        fsync_directory(os.path.dirname(path) or ".")
    return fsync_seconds


def append_unsynced(path: str, data: bytes) -> tuple[int, bool]:
    """Append ``data`` (whole lines) under ``LOCK_EX``, torn-line repair first; no fsync.

    Returns the open descriptor, which the caller makes durable and closes, and whether the
    file was new (then its directory entry needs an fsync too).
    """
    while True:
        fd = open_capture_file(path)
        try:
            appended = append_to_open_file(fd, data)
        except BaseException:
            os.close(fd)
            raise
        if appended is not None:
            return fd, appended[0] == 0
        os.close(fd)  # Unlinked between the open and the lock (a collector's clear): again.


def open_capture_file(path: str) -> int:
    """A descriptor for appending to ``path`` (created with mode 0644 when missing)."""
    return os.open(path, _OPEN_FLAGS, _FILE_MODE)


def append_to_open_file(fd: int, data: bytes, known_end: int | None = None) -> tuple[int, int] | None:
    """Append ``data`` (whole lines) to an open capture file under ``LOCK_EX``; no fsync.

    Returns (size before, size after), or None, with nothing written, when the file has been
    unlinked since it was opened (`clear_model_call_captures` before a new dispatch): the caller
    opens the path again. ``known_end``: the size this writer left the file at; when the file
    still has that size its last byte is this writer's LF, and the torn-line check is skipped.
    """
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        status = os.fstat(fd)
        if status.st_nlink == 0:
            return None
        size_before = status.st_size
        repair = b"" if size_before == known_end else _terminate_torn_line(fd, size_before)
        _write_whole(fd, repair + data, size_before)
        return size_before, size_before + len(repair) + len(data)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


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


def fsync_directory(directory: str) -> None:
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
