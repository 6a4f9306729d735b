"""The capture process: the sidecar's lines appended and made durable outside its interpreter (issue 34).

In the sidecar's own process the writer threads share one interpreter lock with the event loop,
and every syscall of an append (flock, fstat, write, unlock, fsync) hands it back and forth: with
64 calls at once the sidecar used 0.9 of a core and the machine stayed 40% idle, on tmpfs as on
disk. Here the event loop builds each line and sends it down a socket; this process appends the
lines that arrived together (the file contract of `records.append_capture_line`, through the
group committer's open files), makes them durable with one barrier (`make_durable`: fsync for one
file, syncfs for several) and acknowledges each line. The sidecar releases a reply's end only on
its line's acknowledgement, so "the line is on disk before the agent sees the end" holds as before.

Started with `persist_process_command` (its arguments: FD DIRECTORY SYNC_MODE IDLE_SECONDS
SWEEP_SECONDS), FD one end of a socket pair; it ends when the sidecar closes its end (or dies: then it
appends what it had received first). The wire, both ways big-endian:

- from the process first, ``R``: it is ready (its imports done);
- a line: ``!IQH`` (the line's size, its number, the path's size), the path, the line;
- an acknowledgement: ``!QiId`` (the number, 0 or the errno that failed it -- -1 for a failure
  that is not an OSError --, the bytes appended, the barrier's seconds).
"""

from __future__ import annotations

import os
import select
import struct
import sys
import time
from typing import Iterable, Optional

from records import filesystem_type, load_syncfs, syncfs_flushes
from . import _group_commit, _open_files
from ._group_commit import Outcome, append_by_file, make_durable
from ._open_files import OpenFile, OpenFiles, keeps_files_open_safely

LINE_HEADER = struct.Struct("!IQH")
ACK = struct.Struct("!QiId")
#: The process's first byte: its imports are done, lines may come.
READY = b"R"
#: What the sidecar runs (``python -c``: ``-m`` would run this module a second time, beside the
#: copy the package's import made).
_ENTRY = "import sys; from capture._persist_process import main; main(sys.argv[1:])"
#: What one read takes before its lines are appended: enough for every line of a busy moment.
_READ_BYTES = 1 << 20
_BATCH_BYTES = 8 << 20


def persist_process_command(fd: int, directory: str, sync_mode: str) -> list[str]:
    """The command line of a capture process reading lines from ``fd``, with this process's
    open-file policy (`capture._open_files`, as the writer threads would follow it)."""
    return [sys.executable, "-c", _ENTRY, str(fd), directory, sync_mode, repr(_open_files.IDLE_SECONDS),
            repr(_group_commit._SWEEP_SECONDS)]


def frame_lines(lines: Iterable[tuple[int, bytes, bytes]]) -> bytes:
    """Lines (number, path, line) as the capture process reads them, each line's bytes copied
    once (a 32k-token stream's line is megabytes)."""
    parts: list[bytes] = []
    for number, path, line in lines:
        parts += (LINE_HEADER.pack(len(line), number, len(path)), path, line)
    return b"".join(parts)


def frame_line(number: int, path: bytes, line: bytes) -> bytes:
    """One line as the capture process reads it."""
    return frame_lines(((number, path, line),))


def serve(fd: int, directory: str, sync_mode: str, sweep_seconds: float) -> None:
    """Append and acknowledge until the other end closes."""
    fstype = filesystem_type(directory)
    syncfs = load_syncfs() if sync_mode == "auto" and syncfs_flushes(fstype) else None
    files = OpenFiles(keeps_files_open_safely(fstype))
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    _send_all(fd, READY)
    pending, swept, open_ = bytearray(), time.monotonic(), True
    # One buffer for every read: `os.read` of 1 MiB maps and unmaps a new one each time (three
    # syscalls, 15 µs of a 2.5 µs read, on the way of every call that waits alone).
    buffer = bytearray(_READ_BYTES)
    received = memoryview(buffer)
    while open_:
        ready = poller.poll(sweep_seconds * 1000)
        now = time.monotonic()
        if now - swept >= sweep_seconds:
            swept = now
            files.close_idle(now)  # A finished rollout's file lets go of its space (issue 30).
        while ready:  # Everything that came together is one batch (and a line longer than a batch is read whole).
            size = os.readv(fd, [buffer])
            if not size:
                open_ = False
                break
            pending += received[:size]
            # A read that did not fill the buffer took all there was: no syscall to ask again.
            ready = poller.poll(0) if size == _READ_BYTES and len(pending) < _BATCH_BYTES else []
        lines, used = _take_lines(pending)
        del pending[:used]
        if lines:
            _send_all(fd, _commit(lines, files, syncfs))
    files.close_all()


def _take_lines(buffer: bytearray) -> tuple[list[tuple[int, str, bytes]], int]:
    """The whole lines at the front of ``buffer`` (number, path, line) and the bytes they took."""
    lines, at, header = [], 0, LINE_HEADER.size
    while len(buffer) - at >= header:
        size, number, path_size = LINE_HEADER.unpack_from(buffer, at)
        end = at + header + path_size + size
        if end > len(buffer):
            break
        path_end = at + header + path_size
        lines.append((number, os.fsdecode(bytes(buffer[at + header:path_end])), bytes(buffer[path_end:end])))
        at = end
    return lines, at


def _commit(lines: list[tuple[int, str, bytes]], files: OpenFiles, syncfs: Optional[object]) -> bytes:
    """Append each file's lines in one write, one barrier for all, the acknowledgements."""
    outcomes: list[Outcome] = [0.0] * len(lines)
    by_path: dict[str, list[int]] = {}
    for index, (_, path, _) in enumerate(lines):
        by_path.setdefault(path, []).append(index)
    held: list[tuple[OpenFile, list[int]]] = []
    try:
        held, new_directories = append_by_file(files, by_path, [line for _, _, line in lines], outcomes)
        if held:
            whole = syncfs if len(held) > 1 else None
            for (_, indexes), outcome in zip(held, make_durable([file.fd for file, _ in held], whole,  # type: ignore[arg-type]
                                                                 new_directories)):
                for i in indexes:
                    outcomes[i] = outcome
    finally:
        for file, _ in held:
            files.release(file)
    acks = []
    for (number, _, line), outcome in zip(lines, outcomes):
        if isinstance(outcome, BaseException):
            code = outcome.errno if isinstance(outcome, OSError) and outcome.errno else -1
            acks.append(ACK.pack(number, code, 0, 0.0))
        else:
            acks.append(ACK.pack(number, 0, len(line), outcome))
    return b"".join(acks)


def _send_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BrokenPipeError:
            return  # The sidecar is gone: what it sent is on disk, nobody waits for the word.


def main(argv: list[str]) -> None:
    fd, directory, sync_mode, idle_seconds, sweep_seconds = argv
    _open_files.IDLE_SECONDS = float(idle_seconds)  # The sidecar's policy (`capture._open_files`).
    serve(int(fd), directory, sync_mode, float(sweep_seconds))

