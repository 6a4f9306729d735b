"""The capture process: the sidecar's lines appended and made durable outside its interpreter (issue 34).

In the sidecar's own process the writer threads share one interpreter lock with the event loop,
and every syscall of an append (flock, fstat, write, unlock, fsync) hands it back and forth: with
64 calls at once the sidecar used 0.9 of a core and the machine stayed 40% idle, on tmpfs as on
disk. Here the event loop builds each line (a large call's: its fields, which this process
encodes) and sends it down a socket; this process appends the lines that arrived together (the
file contract of `records.contract.append_capture_line`, through the group committer's open files), makes
them durable with one barrier (`make_durable`: fsync for one file, syncfs for several) and
acknowledges each line. The sidecar releases a reply's end only on
its line's acknowledgement, so "the line is on disk before the agent sees the end" holds as before.

Started with `persist_process_command` (its arguments: FD DIRECTORY SYNC_MODE IDLE_SECONDS
SWEEP_SECONDS), FD one end of a socket pair; it ends when the sidecar closes its end (or dies: then it
appends what it had received first). The wire, both ways big-endian:

- from the process first, ``R``: it is ready (its imports done);
- a line: ``!IQHB`` (the payload's size, its number, the path's size, its kind), the path, the
  payload: `LINE`, the line's bytes; or `FIELDS`, the line's fields pickled, which this process
  encodes (`records.contract.encode_capture_line`): a streamed call's line is mostly its raw text, and
  escaping it is one C call of 40 µs for a 256-event stream, 40 ms for a 32k-token one, that
  held the sidecar's interpreter; pickling the fields is a copy (3.6 µs);
  or `JOB`, a job pickled (`capture.journal._jobs`): a function this process calls to make the
  line, writing the other files the line's barrier makes durable too (the token mode's entries);
- an acknowledgement: ``!QiIdI`` (the number, 0 or the errno that failed it -- `NOT_APPENDED` for a
  failure that is not an OSError, `NOT_ENCODED` for fields JSON cannot hold, `NOT_BUILT` for a job
  that raised --, the bytes appended, the barrier's seconds, the size of the reply that follows: a
  job's ``reply()`` pickled, what a job that raised raised (its text), else nothing).
"""

from __future__ import annotations

import io
import os
import pickle
import select
import struct
import sys
import time
from typing import Any, Iterable, Optional

from records.contract import encode_capture_line, filesystem_type, load_syncfs, syncfs_flushes
from . import _group_commit, _open_files
from ._group_commit import Outcome, append_by_file, make_also_durable, make_durable
from ._jobs import FragmentPickler, JobLine, reply_of, run_pickled_job
from ._open_files import OpenFile, OpenFiles, keeps_files_open_safely
from ._segments import SegmentFiles, SegmentPolicy

LINE_HEADER = struct.Struct("!IQHB")
ACK = struct.Struct("!QiIdI")
#: What a frame carries: the line's bytes, its fields pickled (this process encodes them), or a
#: job pickled (this process runs it: `capture.journal._jobs`).
LINE, FIELDS, JOB = 0, 1, 2
#: An acknowledgement's code for a line that failed without an errno, for fields that could not be
#: encoded (a value JSON cannot hold, as `encode_capture_line` raises on the loop), and for a job
#: that raised instead of making its line.
NOT_APPENDED, NOT_ENCODED, NOT_BUILT = -1, -2, -3
#: The process's first byte: its imports are done, lines may come.
READY = b"R"
#: What the sidecar runs (``python -c``: ``-m`` would run this module a second time, beside the
#: copy the package's import made).
_ENTRY = "import sys; from capture.journal._process_main import main; main(sys.argv[1:])"
#: What one read takes before its lines are appended: enough for every line of a busy moment.
_READ_BYTES = 1 << 20
_BATCH_BYTES = 8 << 20


def persist_process_command(fd: int, directory: str, sync_mode: str,
                            segments: Optional[SegmentPolicy] = None) -> list[str]:
    """The command line of a capture process reading lines from ``fd``, with this process's
    open-file policy (`capture.journal._open_files`, as the writer threads would follow it), and
    the segment policy when lines go to writer segments (docs/files.md)."""
    return [sys.executable, "-c", _ENTRY, str(fd), directory, sync_mode, repr(_open_files.IDLE_SECONDS),
            repr(_group_commit._SWEEP_SECONDS), segments.as_argument() if segments is not None else ""]


def frame_lines(lines: Iterable[tuple[int, bytes, bytes, int]]) -> bytes:
    """Lines (number, path, payload, kind) as the capture process reads them, each payload
    copied once (a 32k-token stream's line is megabytes)."""
    parts: list[bytes] = []
    for number, path, payload, kind in lines:
        parts += (LINE_HEADER.pack(len(payload), number, len(path), kind), path, payload)
    return b"".join(parts)


def frame_line(number: int, path: bytes, payload: bytes, kind: int = LINE) -> bytes:
    """One line as the capture process reads it."""
    return frame_lines(((number, path, payload, kind),))


def pickle_fields(fields: dict[str, Any]) -> bytes:
    """A line's fields as a `FIELDS` payload (a stream's ``orjson.Fragment`` lists as their text:
    `FragmentPickler`)."""
    buffer = io.BytesIO()
    FragmentPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(fields)
    return buffer.getvalue()


def encode_pickled_fields(payload: bytes) -> bytes:
    """The line of a `FIELDS` payload (also where the sidecar appends on its own threads). Only
    the sidecar that started this process writes to its socket pair (never a port): its pickles
    are its own."""
    return encode_capture_line(pickle.loads(payload))


def serve(fd: int, directory: str, sync_mode: str, sweep_seconds: float,
          segments: Optional[SegmentPolicy] = None) -> None:
    """Append and acknowledge until the other end closes."""
    fstype = filesystem_type(directory)
    syncfs = load_syncfs() if sync_mode == "auto" and syncfs_flushes(fstype) else None
    files: OpenFiles | SegmentFiles = (SegmentFiles(segments) if segments is not None
                                       else OpenFiles(keeps_files_open_safely(fstype)))
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


def _take_lines(buffer: bytearray) -> tuple[list[tuple[int, str, bytes, int]], int]:
    """The whole frames at the front of ``buffer`` (number, path, payload, kind) and the bytes
    they took."""
    lines, at, header = [], 0, LINE_HEADER.size
    while len(buffer) - at >= header:
        size, number, path_size, kind = LINE_HEADER.unpack_from(buffer, at)
        end = at + header + path_size + size
        if end > len(buffer):
            break
        path_end = at + header + path_size
        lines.append((number, os.fsdecode(bytes(buffer[at + header:path_end])), bytes(buffer[path_end:end]), kind))
        at = end
    return lines, at


class _NotEncoded(Exception):
    """A `FIELDS` payload that is no line: acknowledged `NOT_ENCODED`, never appended."""


class _NotBuilt(Exception):
    """A `JOB` that raised: acknowledged `NOT_BUILT`, nothing of it appended."""


def _commit(frames: list[tuple[int, str, bytes, int]], files: "OpenFiles | SegmentFiles", syncfs: Optional[object]) -> bytes:
    """Encode the lines sent as fields and run the jobs; append each file's lines in one write,
    one barrier for all (and for the files the jobs wrote); the acknowledgements."""
    outcomes: list[Outcome] = [0.0] * len(frames)
    lines: list[bytes] = []
    by_path: dict[str, list[int]] = {}
    jobs: dict[int, JobLine] = {}
    for index, (_, path, payload, kind) in enumerate(frames):
        if kind != LINE:
            try:
                if kind == JOB:
                    try:
                        made = jobs[index] = run_pickled_job(payload)
                    except Exception as exc:
                        raise _NotBuilt(exc) from exc
                    payload = made.line
                elif kind == FIELDS:
                    payload = encode_pickled_fields(payload)
                else:
                    raise ValueError(f"a frame of unknown kind {kind}")
            except Exception as exc:
                outcomes[index] = exc if isinstance(exc, _NotBuilt) else _NotEncoded(exc)
                lines.append(b"")
                continue
        lines.append(payload)
        by_path.setdefault(path, []).append(index)
    held: list[tuple[OpenFile, list[int]]] = []
    try:
        held, new_directories = append_by_file(files, by_path, lines, outcomes)
        if held:
            also = [(index, made.also, made.not_durable) for index, made in jobs.items()
                    if made.also and not isinstance(outcomes[index], BaseException)]
            # As the writer threads do (`GroupCommitter._barrier`): one flush of the filesystem
            # covers the jobs' files on it; those elsewhere are fsynced.
            whole = syncfs if syncfs is not None and (len(held) > 1 or also) else None
            if whole is None:
                make_also_durable(also, outcomes, None)
            durable = make_durable([file.fd for file, _ in held], whole, new_directories)  # type: ignore[arg-type]  # syncfs is the loaded function or None
            if whole is not None and also:
                make_also_durable(also, outcomes, None if isinstance(durable[0], BaseException)
                                  else os.fstat(held[0][0].fd).st_dev)
            for (_, indexes), outcome in zip(held, durable):
                for i in indexes:
                    if not isinstance(outcomes[i], BaseException):
                        outcomes[i] = outcome
    finally:
        for file, _ in held:
            files.release(file)
    acks: list[bytes] = []
    for index, ((number, *_), line, outcome) in enumerate(zip(frames, lines, outcomes)):
        reply = reply_of(jobs.get(index))
        if isinstance(outcome, BaseException):
            if isinstance(outcome, _NotEncoded):
                code = NOT_ENCODED
            elif isinstance(outcome, _NotBuilt):  # Its reply: what it raised, for the sidecar's log.
                code, reply = NOT_BUILT, f"{type(outcome.__cause__).__name__}: {outcome.__cause__}".encode()
            else:
                code = outcome.errno if isinstance(outcome, OSError) and outcome.errno else NOT_APPENDED
            acks += (ACK.pack(number, code, 0, 0.0, len(reply)), reply)
        else:
            acks += (ACK.pack(number, 0, len(line), outcome, len(reply)), reply)
    return b"".join(acks)


def _send_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BrokenPipeError:
            return  # The sidecar is gone: what it sent is on disk, nobody waits for the word.


def main(argv: list[str]) -> None:
    fd, directory, sync_mode, idle_seconds, sweep_seconds, segments = argv
    _open_files.IDLE_SECONDS = float(idle_seconds)  # The sidecar's policy (`capture.journal._open_files`).
    serve(int(fd), directory, sync_mode, float(sweep_seconds),
          SegmentPolicy.from_argument(segments) if segments else None)

