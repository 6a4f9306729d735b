"""The sidecar's end of the capture process (`capture.journal._process_main`; issue 34).

Each line goes down a socket pair, numbered; the process appends the lines that arrive
together, makes them durable with one barrier and acknowledges each: ``done(size, outcome)`` then
runs on the event loop with the barrier's seconds, or the OSError that failed the line. A line
goes at once to a process with nothing in flight (one call at a time waits for nothing); while it
works, the lines of one pass of the event loop go in one write, eight at most (it starts on them
while the loop works on the calls behind).

Lines go only once the process has said it is ready (its imports done). A process that dies
(the OOM killer, ``kill -9``) fails the lines it was sent and had not acknowledged -- each is then
a capture failure, counted, logged and marked like any other; the reply is released as ever --
and hands the lines it was never sent (all of them, when it never came up) to ``on_lost``: the
writer appends them, and every line after them, on its own threads (`GroupCommitter`). A
crash is not retried into a crash loop, and no line waits for a process that may never come back.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
from typing import Callable, Optional

from ._process_main import ACK as PERSIST_ACK
from ._process_main import LINE as PERSIST_LINE
from ._process_main import NOT_BUILT as PERSIST_NOT_BUILT
from ._process_main import NOT_ENCODED as PERSIST_NOT_ENCODED
from ._process_main import READY as PERSIST_READY
from ._process_main import frame_lines, persist_process_command
from ._segments import SegmentPolicy

log = logging.getLogger("mcc.capture")

#: What a line's ``done`` receives: the bytes appended, the barrier's seconds or the failure, and a
#: job's reply (pickled; empty for a line: `capture.journal._jobs`).
Done = Callable[[int, "float | BaseException", bytes], None]
#: A line the process was never sent: its path, the payload and its kind (`_process_main.LINE`:
#: the line; `_process_main.FIELDS`: its fields pickled), whom to tell.
Unsent = tuple[bytes, bytes, int, Done]
#: Lines queued on the loop are sent once this many wait, else at the end of the loop's pass.
_SEND_AT = 8


class CaptureProcessLost(Exception):
    """The capture process ended before it acknowledged the line."""


class LineNotEncoded(TypeError):
    """The capture process could not encode a line's fields as JSON (as `records.contract.encode_capture_line`
    raises on a value JSON cannot hold)."""


class LineNotBuilt(RuntimeError):
    """A job the capture process ran raised instead of making its line (`capture.journal._jobs`)."""


class CaptureProcess:
    """Starts the capture process for ``directory`` and sends it lines. Raises OSError when it
    cannot be started (then the writer keeps its own threads)."""

    def __init__(self, directory: str, sync_mode: str, on_lost: Callable[[list[Unsent]], None],
                 segments: Optional[SegmentPolicy] = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._on_lost = on_lost
        ours, theirs = socket.socketpair()
        try:
            # Its own session: a terminal's Ctrl-C reaches the sidecar, which drains, then closes the socket.
            self._process = subprocess.Popen(
                persist_process_command(theirs.fileno(), directory, sync_mode, segments), pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL, env=_child_environment(), start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._socket = ours
        self._transport: Optional[asyncio.Transport] = None
        #: The process has said it is ready (`PERSIST_READY`): lines may go.
        self.ready = False
        #: Lines not sent yet: (number, path, payload, kind).
        self._queued: list[tuple[int, bytes, bytes, int]] = []
        self._waiting: dict[int, Done] = {}
        self._number = 0
        self._closing = False
        self._lost = False
        self._settled = asyncio.Event()
        self._settled.set()
        self._connecting = self._loop.create_task(self._connect())

    @property
    def pid(self) -> int:
        return self._process.pid

    def submit(self, path: bytes, payload: bytes, done: Done, kind: int = PERSIST_LINE) -> None:
        """Send one line for ``path`` (``payload``: the line, or with `_process_main.FIELDS` its
        fields pickled); ``done`` runs on the event loop once it is durable or failed."""
        if self._closing:
            raise RuntimeError("the capture process is closed")
        if self._lost:
            raise CaptureProcessLost("the capture process has ended")
        idle = not self._waiting
        self._number += 1
        self._waiting[self._number] = done
        self._settled.clear()
        queued = self._queued
        queued.append((self._number, path, payload, kind))
        if idle or len(queued) >= _SEND_AT:
            self._send()  # An idle process starts at once; a busy one gets what this pass adds, together.
        elif len(queued) == 1:
            self._loop.call_soon(self._send)

    async def close(self) -> None:
        """Wait for every line sent to be acknowledged, then end the process."""
        self._closing = True
        self._send()
        await self._settled.wait()
        await self._connecting
        if self._transport is not None:
            self._transport.close()
        else:
            self._socket.close()
        await self._loop.run_in_executor(None, self._reap)

    # -- the socket --------------------------------------------------------------------------

    async def _connect(self) -> None:
        try:
            self._transport, _ = await self._loop.connect_accepted_socket(lambda: _Acknowledgements(self),
                                                                          self._socket)
        except OSError as exc:
            self.lost(exc)

    def now_ready(self) -> None:
        self.ready = True
        self._send()

    def _send(self) -> None:
        if self._queued and self.ready and not self._lost:
            data = frame_lines(self._queued)
            self._queued.clear()
            self._transport.write(data)  # type: ignore[union-attr]  # ready implies connected

    def acknowledged(self, number: int, outcome: "float | BaseException", size: int, reply: bytes = b"") -> None:
        done = self._waiting.pop(number, None)
        if done is not None:
            _tell(done, size, outcome, reply)
        if not self._waiting:
            self._settled.set()

    def lost(self, exc: Optional[BaseException]) -> None:
        """The socket closed: expected after `close`, else the process died."""
        if self._closing and not self._waiting:
            return
        if self._lost:
            return
        self._lost = True
        if self._transport is not None:
            self._transport.close()  # A process that said something else than ready gets its EOF.
        waiting, self._waiting = self._waiting, {}
        unsent = [(path, payload, kind, waiting.pop(number)) for number, path, payload, kind in self._queued]
        self._queued.clear()
        log.error("the capture process (pid %d) ended%s%s: %d line(s) it was sent and had not acknowledged "
                  "are capture failures; the sidecar appends its lines itself from now on", self._process.pid,
                  f" ({exc})" if exc else "", "" if self.ready else " before it was ready", len(waiting),
                  extra={"pid": self._process.pid})
        self._loop.run_in_executor(None, self._reap)
        error = CaptureProcessLost(f"the capture process (pid {self._process.pid}) ended before the line was durable")
        for done in waiting.values():
            _tell(done, 0, error, b"")
        self._settled.set()
        self._on_lost(unsent)

    def _reap(self) -> None:
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def _tell(done: Done, size: int, outcome: "float | BaseException", reply: bytes) -> None:
    try:
        done(size, outcome, reply)
    except Exception:  # One call's bug must not end the socket, and every other call's line with it.
        log.exception("settling a capture line failed")


class _Acknowledgements(asyncio.Protocol):
    """Reads the process's acknowledgements (`capture.journal._process_main`'s wire)."""

    def __init__(self, owner: CaptureProcess) -> None:
        self._owner = owner
        self._pending = b""

    def data_received(self, data: bytes) -> None:
        if not self._owner.ready:  # Its first byte says it is ready.
            if data[:1] != PERSIST_READY:
                self._owner.lost(RuntimeError(f"the capture process said {data[:16]!r}, not that it was ready"))
                return
            self._owner.now_ready()
            data = data[1:]
        pending = self._pending + data if self._pending else data
        acknowledged, header, at = self._owner.acknowledged, PERSIST_ACK.size, 0
        view = memoryview(pending)
        while len(pending) - at >= header:
            number, code, size, seconds, reply_size = PERSIST_ACK.unpack_from(pending, at)
            end = at + header + reply_size
            if end > len(pending):
                break
            reply = bytes(view[at + header:end]) if reply_size else b""
            at = end
            if code == 0:
                acknowledged(number, seconds, size, reply)
            elif code > 0:
                acknowledged(number, OSError(code, os.strerror(code)), 0, reply)
            elif code == PERSIST_NOT_ENCODED:
                acknowledged(number, LineNotEncoded("the line's fields are not JSON (encoded by the capture process)"), 0)
            elif code == PERSIST_NOT_BUILT:
                raised = reply.decode(errors="replace")
                acknowledged(number, LineNotBuilt(f"the line's job raised in the capture process: {raised}"), 0)
            else:
                acknowledged(number, CaptureProcessLost("the capture process could not append the line"), 0, reply)
        view.release()
        self._pending = pending[at:]

    def connection_lost(self, exc: Optional[BaseException]) -> None:
        self._owner.lost(exc)


def _child_environment() -> dict[str, str]:
    """This process's environment, with the directory ``capture`` was imported from first on the
    path (a checkout run from source imports it from there, not from site-packages)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}"}
