"""Group sync: appends to many files made durable by one ``syncfs`` (issue 34).

The capture writer (`capture.journal.GroupCommitter`) makes a batch of capture lines durable with one
barrier; the token capture mode's intents (`records.contract.TokenFiles.begin_call`) come one a call from
many threads, each of which must wait for its own line. `GroupSync` gives them the same: a
thread whose file must be durable either runs the next barrier itself or waits for one that
began after its write -- ``fsync`` of the file when it is alone, ``syncfs`` of the filesystem when
several threads wait (one flush for all, where each ``fsync`` would be a journal commit of its
own). ``syncfs`` only where the filesystem is known to honour it; elsewhere each file is fsynced.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import threading
from typing import Callable, Optional

log = logging.getLogger("mcc.capture")

#: Local filesystems whose ``syncfs`` writes back every file's data and metadata. Elsewhere --
#: FUSE (a daemon may not implement it: the call then returns 0 and flushes nothing), NFS, CIFS,
#: Ceph, unknown -- each file is fsynced, which every filesystem honours.
_SYNCFS_FLUSHES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs", "overlay"})


def syncfs_flushes(fstype: Optional[str]) -> bool:
    return fstype in _SYNCFS_FLUSHES


def filesystem_type(directory: str, mountinfo: Optional[str] = None) -> Optional[str]:
    """The type of the filesystem ``directory`` is on, from ``/proc/self/mountinfo`` (None if unknown)."""
    return mount_of(directory, mountinfo)[0]


def mount_of(directory: str, mountinfo: Optional[str] = None) -> tuple[Optional[str], str]:
    """The type and the super options (``rw,flock``) of the mount ``directory`` is on, from
    ``/proc/self/mountinfo`` ((None, "") if unknown)."""
    if mountinfo is None:
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
                mountinfo = handle.read()
        except OSError:
            return None, ""
    path = os.path.realpath(directory)
    best, found = -1, (None, "")  # type: tuple[int, tuple[Optional[str], str]]
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if " - " not in line or len(fields) < 5:
            continue
        mount_point = fields[4].replace("\\040", " ")
        after = line.split(" - ", 1)[1].split(" ")
        inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= best:  # The deepest mount wins; a later one shadows.
            best, found = len(mount_point), (after[0], after[2] if len(after) > 2 else "")
    return found


@functools.lru_cache(maxsize=None)
def load_syncfs() -> Optional[Callable[[int], int]]:
    """libc's ``syncfs(fd)`` (Linux), or None where there is none (then: fsync file by file)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return None
    syncfs.argtypes = [ctypes.c_int]
    syncfs.restype = ctypes.c_int
    return syncfs


def sync_filesystem(path: str) -> None:
    """Everything written to ``path``'s filesystem is durable: one ``syncfs`` of it where the
    kernel has one, else a ``sync`` (a batch of files made durable at once, not an fsync each)."""
    syncfs = load_syncfs()
    if syncfs is not None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if call_syncfs(syncfs, fd) is None:
                return
        finally:
            os.close(fd)
    os.sync()


def call_syncfs(syncfs: Callable[[int], int], fd: int) -> Optional[OSError]:
    if syncfs(fd) == 0:
        return None
    code = ctypes.get_errno()
    return OSError(code, f"syncfs: {os.strerror(code)}")


#: Failed barriers remembered for threads still waiting on them (each waiter needs only the last few).
_FAILURES_KEPT = 1024


class GroupSync:
    """Durability for appends under ``directory``, shared by the threads that wait at once, and by
    the event loop's calls (`after_durable`), which never hold a thread while they wait."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._changed = threading.Condition(threading.Lock())
        #: Barriers started and finished (numbered from 1); one runs at a time.
        self._started = self._finished = 0
        self._running = False
        #: Files written since the running barrier began: the next barrier's.
        self._waiting: list[str] = []
        #: What `after_durable` was given since the running barrier began: told by the next one.
        self._told: list[Callable[[Optional[OSError]], None]] = []
        #: Runs the barriers that only `after_durable` callers wait for (started at the first).
        self._barrier_thread: Optional[threading.Thread] = None
        self._failures: dict[int, OSError] = {}

    @functools.cached_property
    def _syncfs(self) -> Optional[Callable[[int], int]]:
        """``syncfs`` where the filesystem honours it, else None (each file is fsynced). Found at
        the first wait: a `TokenFiles` that only reads -- `records.trajectories`, one a rollout --
        never looks (the mount table's parse cost it 5x its reading, issue 34)."""
        return load_syncfs() if syncfs_flushes(filesystem_type(self.directory)) else None

    def wait_durable(self, path: str) -> None:
        """Return once what was written to ``path`` before this call is on disk; OSError when the
        barrier that was to make it so failed."""
        if self._syncfs is None:
            _fsync_path(path)
            return
        with self._changed:
            self._waiting.append(path)
            needed = self._started + 1  # The first barrier to begin after the write.
            while self._finished < needed:
                if self._running:
                    self._changed.wait()
                    continue
                self._run_barrier()
            failure = next((self._failures[n] for n in range(needed, self._finished + 1) if n in self._failures), None)
        if failure is not None:
            raise failure

    def after_durable(self, path: str, done: Callable[[Optional[OSError]], None]) -> None:
        """Call ``done(None)`` once what was written to ``path`` before this call is on disk,
        ``done(error)`` when the barrier that was to make it so failed; ``done`` runs on the thread
        that ran that barrier (it must be quick: `asyncio.Future` results go through
        ``call_soon_threadsafe``). Nothing waits meanwhile: an event loop's call hands over its
        intent's flush and goes on (a thread blocked on each would starve the loop's executor: issue 76)."""
        with self._changed:
            self._waiting.append(path)
            self._told.append(done)
            if self._barrier_thread is None:
                self._barrier_thread = threading.Thread(target=self._barrier_loop, name="mcc-group-sync", daemon=True)
                self._barrier_thread.start()
            self._changed.notify_all()

    def _barrier_loop(self) -> None:
        """The barriers `after_durable`'s callers wait for, back to back while any wait (a thread in
        `wait_durable` may run one first: it tells them too)."""
        with self._changed:
            while True:
                while not self._told or self._running:
                    self._changed.wait()
                self._run_barrier()

    def _run_barrier(self) -> None:
        """The next barrier, over every file written since the last began (called and returning
        with the lock held; released meanwhile). Then those `after_durable` was given are told."""
        self._running = True
        self._started += 1
        number, batch, told, self._waiting, self._told = self._started, self._waiting, self._told, [], []
        self._changed.release()
        try:
            failure = self._barrier(batch)
        finally:
            self._changed.acquire()
            self._running = False
            self._finished = number
            self._changed.notify_all()
        if failure is not None:
            self._failures[number] = failure
            while len(self._failures) > _FAILURES_KEPT:
                self._failures.pop(next(iter(self._failures)))
        if told:
            self._changed.release()
            try:
                for done in told:
                    try:
                        done(failure)
                    except Exception:  # One caller's mistake: the others are told, the barriers go on.
                        log.exception("a caller's durability callback failed")
            finally:
                self._changed.acquire()

    def _barrier(self, batch: list[str]) -> Optional[OSError]:
        files = set(batch)
        try:
            if len(files) == 1 or self._syncfs is None:
                for path in files:
                    _fsync_path(path)
                return None
            fd = os.open(self.directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                return call_syncfs(self._syncfs, fd)
            finally:
                os.close(fd)
        except OSError as exc:
            return exc


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
