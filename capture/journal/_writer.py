"""The journal: every capture line's way to the disk, and what happens when that fails (docs/files.md, docs/guarantees.md).

One door, `Journal.submit(rollout_id, build, size, settled)`: ``build()`` makes the line (its
fields, or its bytes, or its bytes and the other files its durability barrier must cover), and
``settled(written)`` runs on the event loop once the line is durable, or once its failure is
counted, logged and marked. The journal knows no call, no exchange and no feature: it knows
lines, files, barriers and processes.

Where a line goes: to the capture process (`_process_client`; issue 34), which appends the lines
of the calls that end together with one barrier, its syscalls not taking turns with the event loop
for one interpreter lock; a large call's fields go to it pickled and it encodes them
(`ENCODE_IN_PROCESS_BYTES`), and a `Job` (a line whose building writes other files its barrier
must cover, the training-token entries of docs/tokens.md) is run there. Every line wherever the
process cannot run (a job too: the same function, run here) is appended by the writer threads with
group commit (`GroupCommitter`). A failure never reaches the client: it is logged once per rollout and kind,
counted, and the rollout is marked ``.capture.incomplete`` where the disk still allows it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional, Protocol, Union

from records.contract import capture_path, create_incomplete_marker, encode_capture_line, incomplete_marker_path

from ._group_commit import AlsoDurable, GroupCommitter
from ._jobs import Job, JobLine, reply_of, run_pickled_job, unpickle_reply
from ._process_client import CaptureProcess, Unsent
from ._process_main import FIELDS, JOB, LINE, encode_pickled_fields, pickle_fields
from ._repeats import RepeatLimiter
from ._segments import SegmentPolicy, seal_leftovers

log = logging.getLogger("mcc.capture")
_PATHS_KEPT = 4096
#: A call whose request and reply together exceed this has its line built on a thread of its own,
#: not on the event loop: a line takes about 3 µs a KB to build (a 32k-token stream's 14 MB line:
#: 45 ms, every other call's bytes stalled meanwhile), and a thread hands the interpreter lock
#: back to the loop every 5 ms. Below it (a 1 KB JSON call, an 85 KB logprob stream) the loop
#: builds it at once, saving two thread hops (issue 34).
BUILD_ON_LOOP_BYTES = 256 * 1024
#: A call whose request and reply together reach this sends the capture process its line's
#: fields pickled, and the process encodes them: a streamed call's line is mostly its raw text,
#: and escaping it is one C call holding the interpreter (measured: a 256-event stream's 54 KB
#: line, 42 µs to encode against 3.6 µs to pickle; a 14 MB one, 40 ms). Below it a line is
#: encoded here: a 1 KB JSON call's takes 2.1 µs, no more than pickling it.
ENCODE_IN_PROCESS_BYTES = 16 * 1024

#: What ``build()`` returns: the line's fields, its bytes, its bytes and the files its barrier
#: must make durable too (`AlsoDurable`), or a job that makes the line where it is appended
#: (`capture.journal._jobs`: it writes such files).
Built = Union[dict[str, Any], bytes, tuple[bytes, AlsoDurable], Job]


class JournalMetrics(Protocol):
    """The counters the journal keeps (the sidecar's metrics have them)."""

    capture_failures: Any
    capture_write_problem: Optional[str]

    def line_durable(self, size: int, barrier_seconds: float) -> None:
        """A line of ``size`` bytes is durable; its batch's barrier took ``barrier_seconds``."""


class Journal:
    """Appends one line per call to ``<capture_dir>/<rollout_id>.capture.jsonl``, durably."""

    def __init__(self, capture_dir: str, metrics: JournalMetrics, sync_mode: str = "auto",
                 process: bool = False, segments: Optional[SegmentPolicy] = None) -> None:
        """``process``: append through a capture process (else on the writer threads);
        ``segments``: every line to this process's writer segments under the spool (docs/files.md),
        not to its rollout's file (segments a crash left open are sealed first)."""
        self.capture_dir = capture_dir
        self._segments = segments
        if segments is not None:
            seal_leftovers(segments.spool_dir)
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()
        self._sync_mode = sync_mode
        self._process: Optional[CaptureProcess] = None
        if process:
            try:
                self._process = CaptureProcess(capture_dir, sync_mode, self._process_lost, segments)
            except Exception as exc:  # OSError (no memory, no pids), or no interpreter to run it (embedded).
                log.warning("cannot start the capture process (%s): the sidecar appends its lines itself", exc)
        self._committer = (GroupCommitter(sync_mode, directory=capture_dir, segments=segments)
                           if self._process is None else None)
        #: Builds the lines of large calls for the capture process (`BUILD_ON_LOOP_BYTES`).
        self._builder: Optional[ThreadPoolExecutor] = None
        self._building = 0
        self._built = asyncio.Event()
        self._built.set()
        #: A read-only or full volume fails every rollout's lines: said once per kind of failure,
        #: then as a count a minute (10k rollouts are not 10k log lines; issue 21).
        self._repeated = RepeatLimiter(log, interval=60.0)
        #: Capture file path by rollout id, for the rollouts of the last while.
        self._paths: dict[str, str] = {}
        self._failing: set[asyncio.Task[None]] = set()
        # Lines settled on the writer threads, handed to the event loop in one callback per batch.
        self._settled: list[tuple[Callable[[bool], None], str, int, object, Optional[Callable[[], None]]]] = []
        self._settled_lock = threading.Lock()
        self.lines_written = 0
        self.failures: Counter[str] = Counter()
        #: Why the last line could not be written to disk (``ENOSPC: ...``), None once one is:
        #: what `/-/ready` and `mcc_capture_dir_writable` report, beside the directory's mode.
        self.write_problem: str | None = None

    def submit(self, rollout_id: str, build: Callable[[], Built], size: int, settled: Callable[[bool], None]) -> None:
        """Queue a line of rollout ``rollout_id``; ``size`` (the call's request and reply bytes)
        says where it is built and how it travels. Never raises: a failure settles it False."""
        try:
            path = self._paths.get(rollout_id)
            if path is None:
                path = capture_path(self.capture_dir, rollout_id)  # Validates the id, once per rollout.
                if len(self._paths) >= _PATHS_KEPT:
                    self._paths.clear()
                self._paths[rollout_id] = path
            if self._process is None:
                made = _Made()
                self._threads().submit(path, lambda: made.line(build()), self._on_thread(settled, rollout_id, made))
            elif size <= BUILD_ON_LOOP_BYTES:
                built = build()
                self._send(path, *_payload(built, size), rollout_id, settled, _on_reply(built))
            else:
                self._build_aside(build, size, path, rollout_id, settled)
        except Exception as exc:
            self._loop.call_soon(self._settle, settled, rollout_id, 0, exc)

    async def persist(self, rollout_id: str, build: Callable[[], Built], size: int) -> bool:
        """`submit`, awaited: True once the line is durable, False (never raise) on failure."""
        future: asyncio.Future[bool] = self._loop.create_future()
        self.submit(rollout_id, build, size, settles(future))
        return await asyncio.shield(future)  # A cancelled handler still lets the line be written.

    async def close(self) -> None:
        """Every line submitted is durable or failed (settled), and the journal has stopped."""
        await self._built.wait()  # The lines still being built are sent first.
        if self._builder is not None:
            self._builder.shutdown(wait=False)
        if self._process is not None:
            await self._process.close()
        if self._committer is not None:
            await self._loop.run_in_executor(None, self._committer.close)

    @property
    def process_pid(self) -> Optional[int]:
        """The capture process's pid; None while the writer threads append."""
        return self._process.pid if self._process is not None else None

    # -- the ways a line goes ------------------------------------------------------------------

    def _on_thread(self, settled: Callable[[bool], None], rollout_id: str,
                   made: "Optional[_Made]" = None) -> Callable[[int, object], None]:
        """The writer threads' ``done``: settlements handed to the loop in one callback a batch
        (with a job's reply, made here: after its line's barrier)."""
        def done(size: int, outcome: object) -> None:  # On a writer thread.
            after = made.replied() if made is not None else None
            with self._settled_lock:
                self._settled.append((settled, rollout_id, size, outcome, after))
                first = len(self._settled) == 1
            if first:
                self._loop.call_soon_threadsafe(self._settle_all)
        return done

    def _send(self, path: str, payload: bytes, kind: int, rollout_id: str, settled: Callable[[bool], None],
              on_reply: Optional[Callable[[Any], None]] = None) -> None:
        """A line built: to the capture process, or to the writer threads once it has died."""
        process = self._process
        if process is None:
            made = _Made(on_reply)
            self._threads().submit(path, made.maker(_line_of(payload, kind)), self._on_thread(settled, rollout_id, made))
            return

        def acknowledged(size: int, outcome: "float | BaseException", reply: bytes) -> None:
            after = (lambda: on_reply(unpickle_reply(reply))) if on_reply is not None else None
            self._settle(settled, rollout_id, size, outcome, after)
        process.submit(os.fsencode(path), payload, acknowledged, kind)

    def _build_aside(self, build: Callable[[], Built], size: int, path: str, rollout_id: str,
                     settled: Callable[[bool], None]) -> None:
        """A large call's line, built on the builder thread, then sent from the loop."""
        if self._builder is None:
            self._builder = ThreadPoolExecutor(1, thread_name_prefix="mcc-capture-build")
        self._building += 1
        self._built.clear()
        def made() -> tuple[bytes, int, Optional[Callable[[Any], None]]]:
            line = build()
            return (*_payload(line, size), _on_reply(line))
        building = self._builder.submit(made)

        def built(future: "Future[tuple[bytes, int, Optional[Callable[[Any], None]]]]") -> None:  # On the loop.
            try:
                try:
                    payload, kind, on_reply = future.result()
                except Exception as exc:
                    self._settle(settled, rollout_id, 0, exc)
                    return
                self._send(path, payload, kind, rollout_id, settled, on_reply)
            finally:
                self._building -= 1
                if not self._building:
                    self._built.set()
        building.add_done_callback(lambda future: self._loop.call_soon_threadsafe(built, future))

    def _threads(self) -> GroupCommitter:
        if self._committer is None:
            self._committer = GroupCommitter(self._sync_mode, directory=self.capture_dir, segments=self._segments)
        return self._committer

    def _process_lost(self, unsent: "list[Unsent]") -> None:
        """The capture process died: from now on the writer threads append (`_process_client`),
        first the lines it was never sent."""
        self._process = None
        threads, loop = self._threads(), self._loop
        def settler(done: Callable[..., None], made: _Made) -> Callable[[int, "float | BaseException"], None]:
            def settle(size: int, outcome: "float | BaseException") -> None:
                loop.call_soon_threadsafe(done, size, outcome, reply_of(made.job_line))
            return settle

        for path, payload, kind, done in unsent:
            made = _Made()
            threads.submit(os.fsdecode(path), made.maker(_line_of(payload, kind)), settler(done, made))

    # -- settling --------------------------------------------------------------------------------

    def _settle_all(self) -> None:
        with self._settled_lock:
            settled, self._settled = self._settled, []
        for on_settled, rollout_id, size, outcome, after in settled:
            self._settle(on_settled, rollout_id, size, outcome, after)

    def _settle(self, settled: Callable[[bool], None], rollout_id: str, size: int, outcome: object,
                after: Optional[Callable[[], None]] = None) -> None:
        """``after``: a job's reply to its ``on_reply``, first (the line's end waits for both)."""
        if after is not None:
            try:
                after()
            except Exception:  # One call's bookkeeping must not keep its line from settling.
                log.exception("a capture line's job reply could not be taken")
        if isinstance(outcome, BaseException):
            task = self._loop.create_task(self._fail_then(settled, rollout_id, outcome))
            self._failing.add(task)
            task.add_done_callback(self._failing.discard)
            return
        self.lines_written += 1
        if self.write_problem is not None:
            log.warning("capture lines are written to %s again", self.capture_dir, extra={"path": self.capture_dir})
            self.write_problem = self._metrics.capture_write_problem = None
        self._metrics.line_durable(size, outcome)  # type: ignore[arg-type]  # a durable line's outcome is its time
        settled(True)

    async def _fail_then(self, settled: Callable[[bool], None], rollout_id: str, exc: BaseException) -> None:
        try:
            await self._on_failure(rollout_id, exc)
        finally:
            settled(False)

    async def _on_failure(self, rollout_id: str, exc: BaseException) -> None:
        kind = failure_kind(exc)
        self.failures[kind] += 1
        if isinstance(exc, OSError):  # The disk refused it (ENOSPC, EDQUOT, EIO, EROFS, ...), not a bug.
            self.write_problem = self._metrics.capture_write_problem = f"{kind}: {exc.strerror or exc}"
        self._metrics.capture_failures.labels(kind).inc()
        self._repeated.error(kind, "capture failed for rollout %s (%s) in %s: %s; the call was forwarded unchanged; "
                             "further %s failures are counted (mcc_capture_failures_total) and said once a minute",
                             rollout_id, kind, self.capture_dir, exc, kind,
                             extra={"rollout_id": rollout_id, "errno": getattr(exc, "errno", None),
                                    "path": self.capture_dir, "kind": kind})
        marker = incomplete_marker_path(self.capture_dir, rollout_id)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, create_incomplete_marker, marker)
        except Exception:
            pass  # The directory may be gone or read-only; the failure is already counted.


def _payload(built: Built, size: int) -> tuple[bytes, int]:
    """What the capture process is sent of a line: its bytes, a large call's fields pickled
    (`ENCODE_IN_PROCESS_BYTES`), or a job pickled, and which."""
    if type(built) is Job:
        return built.pickled(), JOB
    if type(built) is dict:
        if size >= ENCODE_IN_PROCESS_BYTES:
            return pickle_fields(built), FIELDS
        return encode_capture_line(built), LINE
    assert type(built) is bytes, "a line with files beside it is a job"
    return built, LINE


def settles(future: "asyncio.Future[bool]") -> Callable[[bool], None]:
    """A line's callback that gives ``future`` its outcome (once: a cut call may settle it first)."""
    def settle(written: bool) -> None:
        if not future.done():
            future.set_result(written)
    return settle


def _on_reply(built: Built) -> Optional[Callable[[Any], None]]:
    return built.on_reply if type(built) is Job else None


class _Made:
    """A line a writer thread builds: a job is run there, and its reply made after the line's barrier."""

    __slots__ = ("on_reply", "job_line")

    def __init__(self, on_reply: Optional[Callable[[Any], None]] = None) -> None:
        self.on_reply = on_reply
        self.job_line: Optional[JobLine] = None

    def line(self, built: Union[Built, JobLine]) -> Union[bytes, tuple[bytes, AlsoDurable]]:
        """The line for the writer threads: fields encoded, a job run (its files named), else as built."""
        if type(built) is Job:
            self.on_reply = built.on_reply
            built = built.run_here()
        if type(built) is JobLine:
            self.job_line = built
            return built.line, (built.also, built.not_durable)
        return encode_capture_line(built) if type(built) is dict else built  # type: ignore[return-value]  # a dict becomes bytes; anything else is already a line

    def maker(self, make: Callable[[], Union[bytes, JobLine]]) -> Callable[[], Union[bytes, tuple[bytes, AlsoDurable]]]:
        """What a writer thread calls for the line ``make`` makes."""
        return lambda: self.line(make())

    def replied(self) -> Optional[Callable[[], None]]:
        """On the writer thread, after the barrier: what the loop runs first (the job's reply)."""
        on_reply, made = self.on_reply, self.job_line
        if on_reply is None:
            return None
        try:
            value = made.reply() if made is not None else None
        except Exception:  # As the capture process does (`reply_of`): the line is written either way.
            value = None
        return lambda: on_reply(value)


def _line_of(payload: bytes, kind: int) -> Callable[[], Union[bytes, JobLine]]:
    """How a writer thread gets the line of a capture process's payload (a job's: run here)."""
    if kind == JOB:
        return lambda: run_pickled_job(payload)
    return (lambda: payload) if kind == LINE else (lambda: encode_pickled_fields(payload))


def failure_kind(exc: BaseException) -> str:
    """A short stable name for a capture failure: the errno name for OS errors."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, f"errno{exc.errno}")
    return type(exc).__name__
