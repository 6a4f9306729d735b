"""Group commit: many calls' lines made durable by one barrier (DESIGN §3, issue 5).

One writer thread takes every line queued since its last batch, appends each file's lines with
the same contract as `append_capture_line` (``O_APPEND`` + ``flock`` + one ``write``, torn-line
repair, rollback on a short write), and then makes the whole batch durable at once: ``fsync`` of
the file when the batch touched one file, ``syncfs`` of the capture filesystem when it touched
several. Every line's callback runs only after that barrier, so "its record is on disk when the
agent sees the end of the reply" still holds line by line.

Why: with one rollout per agent, concurrent calls append to different files, so per-file
``fsync`` cannot be shared; each costs 0.4-4 ms on a virtual disk and they queue. One ``syncfs``
per batch costs about one ``fsync`` whatever the batch size. And one thread instead of a pool
keeps the event loop's thread from fighting eight others for the GIL on every syscall.

``syncfs`` flushes the whole filesystem the capture directory is on: give captures their own
volume (the deploy manifests do), or choose ``sync_mode="fsync"`` to sync file by file.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import threading
import time
from collections import deque
from typing import Callable, Optional, Union

from ._appender import _OPEN_FLAGS, _FILE_MODE, _fsync_directory, _terminate_torn_line, _write_whole

#: What a line's callback receives: the seconds its batch's barrier took, or why it failed.
Outcome = Union[float, BaseException]
#: ``auto``: fsync for a one-file batch, syncfs for several; ``fsync``: always file by file.
SYNC_MODES = ("auto", "fsync")


class GroupCommitter:
    """A writer thread that appends queued lines and makes each batch durable with one barrier."""

    def __init__(self, sync_mode: str = "auto", max_batch: int = 512) -> None:
        if sync_mode not in SYNC_MODES:
            raise ValueError(f"sync_mode must be one of {SYNC_MODES}, not {sync_mode!r}")
        self._syncfs = _load_syncfs() if sync_mode == "auto" else None
        self._max_batch = max_batch
        self._queue: deque[tuple[str, Callable[[], bytes], Callable[[int, Outcome], None]]] = deque()
        self._wakeup = threading.Condition(threading.Lock())
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="mcc-capture-writer", daemon=True)
        self._thread.start()

    def submit(self, path: str, make_line: Callable[[], bytes], done: Callable[[int, Outcome], None]) -> None:
        """Queue one line for ``path``. ``make_line`` runs on the writer thread (serialising off
        the event loop); ``done(size, outcome)`` runs there too, once the line is durable or failed."""
        with self._wakeup:
            if self._closing:
                raise RuntimeError("the capture writer is closed")
            self._queue.append((path, make_line, done))
            self._wakeup.notify()

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        with self._wakeup:
            self._closing = True
            self._wakeup.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while not self._queue and not self._closing:
                    self._wakeup.wait()
                if not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))]
            self._commit(batch)

    def _commit(self, batch: list[tuple[str, Callable[[], bytes], Callable[[int, Outcome], None]]]) -> None:
        outcomes: list[Outcome] = [0.0] * len(batch)
        sizes = [0] * len(batch)
        by_path: dict[str, list[int]] = {}
        lines: list[bytes] = [b""] * len(batch)
        for index, (path, make_line, _) in enumerate(batch):
            try:
                lines[index] = make_line()
            except Exception as exc:  # A line that cannot be built fails alone.
                outcomes[index] = exc
                continue
            sizes[index] = len(lines[index])
            by_path.setdefault(path, []).append(index)
        open_files: list[tuple[int, list[int]]] = []
        new_directories: set[str] = set()
        try:
            for path, indexes in by_path.items():
                try:
                    fd, created = _append_unsynced(path, b"".join(lines[i] for i in indexes))
                except OSError as exc:
                    for i in indexes:
                        outcomes[i] = exc
                    continue
                open_files.append((fd, indexes))
                if created:
                    new_directories.add(os.path.dirname(path) or ".")
            self._barrier(open_files, new_directories, outcomes)
        finally:
            for fd, _ in open_files:
                os.close(fd)
        for index, (_, _, done) in enumerate(batch):
            done(sizes[index], outcomes[index])

    def _barrier(self, open_files: list[tuple[int, list[int]]], new_directories: set[str],
                 outcomes: list[Outcome]) -> None:
        """Make every appended line durable; record the seconds it took, or the error, per line."""
        if not open_files:
            return
        started = time.perf_counter()
        if self._syncfs is not None and len(open_files) > 1:
            # One flush of the filesystem covers every file and new directory entry of the batch.
            error = _call_syncfs(self._syncfs, open_files[0][0])
            seconds = time.perf_counter() - started
            for _, indexes in open_files:
                for i in indexes:
                    outcomes[i] = error if error is not None else seconds
            return
        for fd, indexes in open_files:
            try:
                os.fsync(fd)
                outcome: Outcome = time.perf_counter() - started
            except OSError as exc:
                outcome = exc
            for i in indexes:
                outcomes[i] = outcome
        for directory in new_directories:
            # A new file's directory entry must be durable too, or a crash can lose the whole file.
            _fsync_directory(directory)


def _append_unsynced(path: str, data: bytes) -> tuple[int, bool]:
    """Append ``data`` under ``LOCK_EX`` exactly as `append_capture_line` does, without the fsync.

    Returns the open descriptor (the caller syncs and closes it) and whether the file was new.
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


def _load_syncfs() -> Optional[Callable[[int], int]]:
    """libc's ``syncfs(fd)`` (Linux), or None where there is none (then: fsync file by file)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return None
    syncfs.argtypes = [ctypes.c_int]
    syncfs.restype = ctypes.c_int
    return syncfs  # type: ignore[no-any-return]


def _call_syncfs(syncfs: Callable[[int], int], fd: int) -> Optional[OSError]:
    if syncfs(fd) == 0:
        return None
    code = ctypes.get_errno()
    return OSError(code, f"syncfs: {os.strerror(code)}")
