"""The durable appender: one capture line, all or nothing, on disk before it returns (DESIGN §3).

``O_APPEND`` + ``flock(LOCK_EX)`` + one ``write`` + ``fsync``. The lock is taken on the file
itself, so rollouts never wait on each other while several writers (threads, processes, nodes on a
shared filesystem with POSIX locks) may append to one file. Blocking: run it off the event loop.
"""

from __future__ import annotations

import fcntl
import os
import time

_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
_FILE_MODE = 0o644


def append_capture_line(path: str, line: bytes) -> float:
    """Append ``line`` (one ``\\n``-terminated JSON line) to ``path`` durably, or raise OSError.

    Returns the seconds the ``fsync`` took (for the sidecar's metrics). A short write (full disk, file size limit) is rolled back with ``ftruncate`` while the lock is
    still held, so a failed append never leaves a torn line for readers to skip.
    """
    fd = os.open(path, _OPEN_FLAGS, _FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            size_before = os.fstat(fd).st_size
            _write_whole(fd, line, size_before)
            fsync_started = time.perf_counter()
            os.fsync(fd)
            fsync_seconds = time.perf_counter() - fsync_started
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    if size_before == 0:
        # A new file's directory entry must be durable too, or a crash can lose the whole file.
        _fsync_directory(os.path.dirname(path) or ".")
    return fsync_seconds


def create_incomplete_marker(path: str) -> None:
    """Create the empty ``.capture.incomplete`` marker (idempotent)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), _FILE_MODE)
    os.close(fd)


def _write_whole(fd: int, line: bytes, size_before: int) -> None:
    try:
        written = os.write(fd, line)
    except OSError:
        _roll_back(fd, size_before)
        raise
    if written != len(line):
        _roll_back(fd, size_before)
        raise OSError(f"short write: {written} of {len(line)} bytes")


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
