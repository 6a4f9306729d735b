"""Group commit: many calls' lines made durable by one barrier (docs/files.md, issue 5).

A writer thread takes every line queued since its last batch and appends each file's lines with
the same contract as `append_capture_line` (``O_APPEND`` + ``flock`` + one ``write``, torn-line
repair, rollback on a short write), through files kept open between batches where that is safe
(`capture.journal._open_files`: four syscalls per file instead of seven). A second thread makes everything appended since its last
barrier durable at once: ``fsync`` of the file when that is one file, ``syncfs`` of the capture
filesystem when it is several. The two overlap: the next batch is written while the last one
is synced. Under light load (no line waiting, no barrier running) the writer thread runs the
barrier itself, which saves a thread wake-up on each call's latency. Every line's callback runs only after a barrier that began after its write, so "its
record is on disk when the agent sees the end of the reply" still holds line by line.

Why: with one rollout per agent, concurrent calls append to different files, so per-file
``fsync`` cannot be shared; each costs 0.4-4 ms on a virtual disk and they queue. One ``syncfs``
per batch costs about one ``fsync`` whatever the batch size. And two threads instead of a pool
keep the event loop's thread from fighting eight others for the GIL on every syscall.

``syncfs`` flushes the whole filesystem the capture directory is on: give captures their own
volume (the deploy manifests do), or choose ``sync_mode="fsync"`` to sync file by file. It is
used only on local filesystems known to honour it (ext4, xfs, ...): on FUSE, NFS and the like,
each file is fsynced.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from queue import Empty, SimpleQueue
from typing import Any, Callable, Optional, Union

from records.contract import (
    CAPTURE_SUFFIX, START_INDEX, add_to_index, call_syncfs as _call_syncfs, filesystem_type,
    fsync_directory as _fsync_directory, load_syncfs as _load_syncfs, syncfs_flushes,
)
from ._open_files import OpenFile, OpenFiles, keeps_files_open_safely
from ._segments import SegmentFiles, SegmentPolicy

#: What a line's callback receives: the seconds its batch's barrier took, or why it failed.
Outcome = Union[float, BaseException]
#: Other files a line's builder wrote that must be durable with it (the token capture mode's
#: entries, issue 34), and whom to tell if the barrier fails for them.
AlsoDurable = tuple[list[str], Callable[[BaseException], None]]
#: How often the writer thread closes capture files left idle (`OpenFiles.close_idle`), and seals a
#: segment the uploader asked for (an ended rollout a consumer waits for: within a second, docs/reading.md).
_SWEEP_SECONDS = 0.25
_IDLE = object()
#: ``auto``: fsync for a one-file batch, syncfs for several; ``fsync``: always file by file.
SYNC_MODES = ("auto", "fsync")


class GroupCommitter:
    """A writer thread that appends queued lines and makes each batch durable with one barrier."""

    def __init__(self, sync_mode: str = "auto", max_batch: int = 512, directory: Optional[str] = None,
                 max_open_files: Optional[int] = None, segments: Optional[SegmentPolicy] = None) -> None:
        """``directory``: where the lines go; ``auto`` uses ``syncfs`` only when that directory is
        on a filesystem whose ``syncfs`` is known to flush (see `syncfs_flushes`), and files stay
        open between appends only where that is safe (see `capture.journal._open_files`)."""
        if sync_mode not in SYNC_MODES:
            raise ValueError(f"sync_mode must be one of {SYNC_MODES}, not {sync_mode!r}")
        fstype = filesystem_type(directory) if directory is not None else None
        self._syncfs = _load_syncfs() if sync_mode == "auto" and syncfs_flushes(fstype) else None
        #: Used by the appender thread; released by whichever thread ran the barrier.
        #: ``segments``: this writer's own segment instead of each rollout's file (docs/files.md).
        self._files: OpenFiles | SegmentFiles = (SegmentFiles(segments) if segments is not None else
                                                 OpenFiles(keeps_files_open_safely(fstype), max_open_files))
        self._max_batch = max_batch
        # A SimpleQueue (C): `submit` runs on the event loop's thread for every call, and a
        # Condition's notify costs several times its put. None is the stop sentinel.
        self._queue: SimpleQueue[Optional[_Entry]] = SimpleQueue()
        self._submit_lock = threading.Lock()
        self._closing = False
        #: Appended batches waiting for a barrier; the barrier thread takes them all at once.
        self._appended: deque[Optional[_Appended]] = deque()
        self._appended_ready = threading.Condition(threading.Lock())
        #: A barrier is running (on either thread); barriers never overlap.
        self._syncing = False
        # Two stages, so the next batch is appended while the last one's barrier runs.
        self._appender = threading.Thread(target=self._append_loop, name="mcc-capture-writer", daemon=True)
        self._syncer = threading.Thread(target=self._barrier_loop, name="mcc-capture-sync", daemon=True)
        self._appender.start()
        self._syncer.start()

    def submit(self, path: str, make_line: Callable[[], Union[bytes, tuple[bytes, AlsoDurable]]],
               done: Callable[[int, Outcome], None]) -> None:
        """Queue one line for ``path``. ``make_line`` runs on the writer thread (serialising off
        the event loop); it may name other files it wrote (`AlsoDurable`): the line's barrier
        makes them durable too. ``done(size, outcome)`` runs on a writer thread too, once the
        line (and those files) are durable or failed."""
        with self._submit_lock:  # Nothing is queued behind the stop sentinel.
            if self._closing:
                raise RuntimeError("the capture writer is closed")
            self._queue.put((path, make_line, done))

    def close(self) -> None:
        """Write what is queued, then stop the threads."""
        with self._submit_lock:
            if not self._closing:
                self._closing = True
                self._queue.put(None)
        self._appender.join()
        self._syncer.join()
        self._files.close_all()

    # -- stage 1: build and append ------------------------------------------------------------

    def _append_loop(self) -> None:
        queue, stopping, swept = self._queue, False, time.monotonic()
        first: Any
        while not stopping:
            try:
                first = queue.get(timeout=_SWEEP_SECONDS)
            except Empty:
                first = _IDLE
            if time.monotonic() - swept >= _SWEEP_SECONDS:
                swept = time.monotonic()
                self._files.close_idle(swept)
            if first is _IDLE:
                continue
            batch = [first] if first is not None else []
            stopping = first is None
            while not stopping and len(batch) < self._max_batch and not queue.empty():
                entry = queue.get_nowait()
                if entry is None:
                    stopping = True
                else:
                    batch.append(entry)
            if not batch:
                continue
            appended = self._append(batch)
            if not self._claim_idle_barrier():
                self._hand_over(appended)
                continue
            try:  # Light load: the barrier runs here, saving a thread hop on every call's latency.
                self._sync([appended])
            finally:
                # The barrier thread waits for batches, and none was handed over meanwhile (only
                # this thread hands them over): it is not woken to find nothing to do.
                with self._appended_ready:
                    self._syncing = False
            self._tell([appended])
        self._hand_over(None)  # Tells the barrier thread to stop once it has synced the rest.

    def _claim_idle_barrier(self) -> bool:
        """True (and the barrier is ours) when no line waits and the barrier thread is idle."""
        if not self._queue.empty():
            return False  # Under load the next batch is appended while the barrier thread syncs.
        with self._appended_ready:
            if self._syncing or self._appended:
                return False
            self._syncing = True
            return True

    def _hand_over(self, appended: Optional["_Appended"]) -> None:
        with self._appended_ready:
            self._appended.append(appended)
            self._appended_ready.notify()

    def _append(self, batch: list[_Entry]) -> "_Appended":
        appended = _Appended(batch)
        outcomes, lines = appended.outcomes, [b""] * len(batch)
        by_path: dict[str, list[int]] = {}
        made: Any
        for index, (path, make_line, _) in enumerate(batch):
            try:
                made = make_line()
            except Exception as exc:  # A line that cannot be built fails alone.
                outcomes[index] = exc
                continue
            if type(made) is tuple:
                made, also = made
                appended.also.append((index, also))
            lines[index] = made
            appended.sizes[index] = len(lines[index])
            by_path.setdefault(path, []).append(index)
        appended.open_files, appended.new_directories = append_by_file(self._files, by_path, lines, outcomes)
        return appended

    # -- stage 2: one barrier for everything appended since the last one ----------------------

    def _barrier_loop(self) -> None:
        stopping = False
        while not stopping:
            with self._appended_ready:
                while not self._appended or self._syncing:
                    self._appended_ready.wait()
                taken = list(self._appended)
                self._appended.clear()
                self._syncing = True
            stopping = None in taken
            pending = [appended for appended in taken if appended is not None]
            try:
                self._sync(pending)
            finally:
                with self._appended_ready:
                    self._syncing = False
            self._tell(pending)

    def _sync(self, pending: list["_Appended"]) -> None:
        """One barrier for ``pending``; their files released."""
        try:
            self._barrier(pending)
        finally:
            for appended in pending:
                for file, _ in appended.open_files:
                    self._files.release(file)

    @staticmethod
    def _tell(pending: list["_Appended"]) -> None:
        """Every line's callback: the last thing a thread does before it waits again, so the event
        loop it wakes finds the GIL free, instead of waking to wait for it (each wake-up costs
        20-70 µs on a virtual machine; issue 34)."""
        for appended in pending:
            for index, (_, _, done) in enumerate(appended.batch):
                done(appended.sizes[index], appended.outcomes[index])

    def _barrier(self, pending: list["_Appended"]) -> None:
        """Make every appended line durable; record the seconds it took, or the error, per line."""
        files = [(appended, file.fd, indexes) for appended in pending for file, indexes in appended.open_files]
        if not files:
            return
        also = [(appended, index, extra) for appended in pending for index, extra in appended.also
                if not isinstance(appended.outcomes[index], BaseException)]
        # One flush of the filesystem covers every file and new directory entry appended (and a
        # line's other files on the same filesystem; those elsewhere are fsynced).
        whole = self._syncfs if self._syncfs is not None and (len(files) > 1 or also) else None
        if whole is None:
            self._also_durable(also, None)
        outcomes = make_durable([fd for _, fd, _ in files], whole,
                                {d for appended in pending for d in appended.new_directories})
        if whole is not None and also:
            self._also_durable(also, None if isinstance(outcomes[0], BaseException) else os.fstat(files[0][1]).st_dev)
        for (appended, _, indexes), outcome in zip(files, outcomes):
            for i in indexes:
                if not isinstance(appended.outcomes[i], BaseException):
                    appended.outcomes[i] = outcome

    @staticmethod
    def _also_durable(also: list[tuple["_Appended", int, AlsoDurable]], synced_device: Optional[int]) -> None:
        """The other files lines named, made durable (`make_also_durable`), batch by batch."""
        by_batch: dict[int, tuple[_Appended, list[tuple[int, list[str], Callable[[BaseException], None]]]]] = {}
        for appended, index, (paths, on_failure) in also:
            by_batch.setdefault(id(appended), (appended, []))[1].append((index, paths, on_failure))
        for appended, named in by_batch.values():
            make_also_durable(named, appended.outcomes, synced_device)


def make_also_durable(also: list[tuple[int, list[str], Callable[[BaseException], None]]], outcomes: list[Outcome],
                      synced_device: Optional[int]) -> None:
    """The other files lines named (the line's index, the paths, whom to tell): fsynced, unless on
    ``synced_device`` (just flushed whole). A failure fails the line (its outcome) and is told to
    whoever wrote the file."""
    for index, paths, on_failure in also:
        for path in dict.fromkeys(paths):
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                try:
                    if synced_device is None or os.fstat(fd).st_dev != synced_device:
                        os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                outcomes[index] = exc
                try:
                    on_failure(exc)
                except Exception:
                    pass  # Its own failure is its own; the line's outcome says enough.
                break


def append_by_file(files: OpenFiles | SegmentFiles, by_path: dict[str, list[int]], lines: list[bytes],
                   outcomes: list[Outcome]) -> tuple[list[tuple[OpenFile, list[int]]], set[str]]:
    """Each file's lines (``by_path``: indexes into ``lines``) appended in one write; a failure is
    the outcome of that file's lines. The files appended to (held until their barrier releases
    them) with their lines, and the directories of the files this created (their entries need
    a barrier too)."""
    held: list[tuple[OpenFile, list[int]]] = []
    new_directories: set[str] = set()
    if isinstance(files, SegmentFiles):  # One segment for every rollout: one write, one fsync.
        try:
            file, _ = files.append_batch([(path, b"".join(lines[i] for i in indexes)) for path, indexes in by_path.items()])
        except OSError as exc:
            for indexes in by_path.values():
                for i in indexes:
                    outcomes[i] = exc
            return held, new_directories
        return [(file, [i for indexes in by_path.values() for i in indexes])], new_directories
    for path, indexes in by_path.items():
        try:
            file, created = files.append(path, b"".join(lines[i] for i in indexes))
        except OSError as exc:
            for i in indexes:
                outcomes[i] = exc
            continue
        held.append((file, indexes))
        if created:
            new_directories.add(os.path.dirname(path) or ".")
            _index_start(path)
    return held, new_directories


def _index_start(path: str) -> None:
    """A capture file this append created: the rollout's entry in the directory's start index (a
    rollout with calls and no end is found from there, docs/reading.md). Not made durable: it only
    helps find what is missing, and a failure is never the line's."""
    name = os.path.basename(path)
    if not name.endswith(CAPTURE_SUFFIX):
        return
    try:
        add_to_index(os.path.dirname(path) or ".", START_INDEX, time.time(), name[: -len(CAPTURE_SUFFIX)], durable=False)
    except (OSError, ValueError):
        pass


def make_durable(fds: list[int], syncfs: Optional[Callable[[int], int]], new_directories: set[str]) -> list[Outcome]:
    """One durability barrier for lines appended through ``fds``: one ``syncfs`` of their
    filesystem when given (it covers every file and new directory entry), else an ``fsync`` of
    each file and of each new file's directory (or a crash can lose the whole file). Per
    descriptor, the seconds the barrier took or why it failed."""
    started = time.perf_counter()
    if syncfs is not None:
        error = _call_syncfs(syncfs, fds[0])
        return [error if error is not None else time.perf_counter() - started] * len(fds)
    outcomes: list[Outcome] = []
    for fd in fds:
        try:
            os.fsync(fd)
            outcomes.append(time.perf_counter() - started)
        except OSError as exc:
            outcomes.append(exc)
    for directory in new_directories:
        _fsync_directory(directory)
    return outcomes


#: One queued line: its file, how to build it, whom to tell.
_Entry = tuple[str, Callable[[], Union[bytes, tuple[bytes, AlsoDurable]]], Callable[[int, "Outcome"], None]]


class _Appended:
    """A batch whose lines are written (not yet durable): what the barrier thread needs."""

    __slots__ = ("batch", "outcomes", "sizes", "open_files", "new_directories", "also")

    def __init__(self, batch: list[_Entry]) -> None:
        self.batch = batch
        self.outcomes: list[Outcome] = [0.0] * len(batch)
        self.sizes = [0] * len(batch)
        #: (file, indexes of its lines): held open until the barrier has run.
        self.open_files: list[tuple[OpenFile, list[int]]] = []
        self.new_directories: set[str] = set()
        #: (index of a line, the other files it needs durable with it).
        self.also: list[tuple[int, AlsoDurable]] = []
