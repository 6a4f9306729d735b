"""The uploader in a process of its own (docs/files.md): both ends, `UploaderProcess` in the sidecar and
`main` in the child.

Why a process: an upload reads a sealed segment back, hashes it, and puts it (for an object store,
through its client's own threads and event loop). In the sidecar's process that work takes turns
with the event loop for the interpreter's lock, and every turn is paid on the call path; measured
(`benchmarks/bench_store.py`), an uploader thread added a few µs of event-loop CPU to every call.
In a child it shares nothing with the calls but the machine.

The two talk over pipes. The child writes JSON lines to its stdout: its log records (the sidecar
logs them as its own, in its format) and its store problem when it changes (what ``/-/ready``
says). The sidecar writes one line to the child's stdin to drain it: the seconds it may take to
upload what is sealed and ship the token files; the child then exits, 0 when nothing is left. A
sidecar that dies closes the pipe, and the child exits at once (in a container it goes with the
sidecar anyway): what is sealed stays in the spool for the next sidecar on it, whose uploader
takes it first. A child that dies is started again. Either way nothing is lost: every step of an
upload is safe to repeat, and a put cut short leaves only a temporary name no reader lists.
The lag is read from the spool itself (`spool_lag`), on either side.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from typing import Any, Optional

import orjson

from ._process_client import _child_environment
from ._upload import UploadLag, Uploader, spool_lag

log = logging.getLogger("mcc.capture")
_ENTRY = "import sys; from capture.journal._upload_process import main; main(sys.argv[1:])"
#: The shortest pause between restarts of a child that keeps dying.
_RESTART_SECONDS = 5.0


class UploaderProcess:
    """`Uploader`'s interface for the sidecar (`start`, `lag`, `problem`, `stop`), run in a child."""

    def __init__(self, spool_dir: str, store_url: str, token_idle: float = 60.0) -> None:
        self.spool_dir = spool_dir
        self.store_url = store_url
        self._token_idle = token_idle
        self.problem: Optional[str] = None
        self._process: Optional[subprocess.Popen] = None
        self._reader: Optional[threading.Thread] = None
        self._stopping = False
        self._started_at = 0.0
        self._lock = threading.Lock()

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        with self._lock:
            self._started_at = time.monotonic()
            # Its own session: a terminal's Ctrl-C reaches the sidecar, which drains it.
            self._process = subprocess.Popen(
                [sys.executable, "-c", _ENTRY, self.spool_dir, self.store_url, repr(self._token_idle)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_child_environment(), start_new_session=True)
            self._reader = threading.Thread(target=self._read, args=(self._process,), name="mcc-uploader-pipe",
                                            daemon=True)
            self._reader.start()

    def lag(self) -> UploadLag:
        return spool_lag(self.spool_dir)

    def stop(self, timeout: float) -> bool:
        """Drain the child: what is sealed goes within ``timeout`` seconds; whether nothing is left."""
        with self._lock:
            self._stopping = True
            process = self._process
        if process is None:
            return not self.lag().segments
        try:
            if process.stdin is not None and not process.stdin.closed:  # Stopped twice: once is enough.
                process.stdin.write(f"{timeout!r}\n".encode())
                process.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass
        try:
            code = process.wait(timeout + 15.0)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        if self._reader is not None:
            self._reader.join(5.0)
        return code == 0

    def _read(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            try:
                message = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if "problem" in message:
                self.problem = message["problem"]
            if "message" in message:
                log.log(int(message.get("level", logging.WARNING)), "%s", message["message"])
        code = process.wait()
        with self._lock:
            if self._stopping or process is not self._process:
                return
        log.warning("the uploader process (pid %d) ended with %s; starting it again (the spool keeps what it was "
                    "uploading)", process.pid, code)
        self.problem = f"the uploader process ended with {code}"
        time.sleep(max(0.0, _RESTART_SECONDS - (time.monotonic() - self._started_at)))
        with self._lock:
            if self._stopping:
                return
        self.start()


class _PipeHandler(logging.Handler):
    """The child's log records, one JSON line each on stdout, for the sidecar to log."""

    def __init__(self, out: Any, pipe_lock: threading.Lock) -> None:
        super().__init__()
        self.out, self.pipe_lock = out, pipe_lock  # Not ``lock``: `logging.Handler` holds its own there.

    def emit(self, record: logging.LogRecord) -> None:
        _send(self.out, self.pipe_lock, {"level": record.levelno, "message": record.getMessage()})


def _send(out: Any, lock: threading.Lock, message: dict[str, Any]) -> None:
    with lock:
        try:
            out.write(orjson.dumps(message) + b"\n")
            out.flush()
        except (BrokenPipeError, OSError):
            pass


def main(argv: list[str]) -> None:
    spool_dir, store_url, token_idle = argv
    out, lock = sys.stdout.buffer, threading.Lock()
    logging.getLogger().handlers[:] = [_PipeHandler(out, lock)]
    logging.getLogger().setLevel(logging.WARNING)  # What the sidecar says of its store (not its client's chatter).
    uploader = Uploader(spool_dir, store_url, token_idle=float(token_idle))
    uploader.start()
    told: dict[str, Optional[str]] = {"problem": None}
    drain: dict[str, float] = {}

    def wait_for_the_drain() -> None:
        line = sys.stdin.readline()
        try:
            drain["seconds"] = float(line)
        except ValueError:  # EOF: the sidecar is gone; the spool keeps what is sealed.
            os._exit(0)

    waiter = threading.Thread(target=wait_for_the_drain, name="mcc-uploader-drain", daemon=True)
    waiter.start()
    while waiter.is_alive():
        if uploader.problem != told["problem"]:
            told["problem"] = uploader.problem
            _send(out, lock, {"problem": uploader.problem})
        waiter.join(0.25)
    left = not uploader.stop(drain["seconds"])
    os._exit(3 if left else 0)


__all__ = ["UploaderProcess"]
