"""``mcc serve --workers N``: N sidecar processes on one port (``SO_REUSEPORT``), one event loop
each, so one sidecar can use a whole node. The kernel spreads new connections over the workers.

The supervisor re-runs the same command line once per worker with ``--workers 1 --port P
--reuse-port`` appended (the last occurrence of a flag wins), waits for every worker's ready
line, prints its own, forwards SIGTERM / SIGINT and exits with the workers' worst exit status.
Workers append to the same capture files safely: the file contract locks each append. They
share their metrics through a directory the supervisor makes, so every scrape of the port sees
the sum over all workers (`_shared_metrics`).

A worker that dies (a crash, the OOM killer, ``kill -9``) is noticed at once, logged, and
replaced: its in-flight calls are lost either way, and the others keep serving theirs, which an
exit of the whole pod would cut too. Its counters stay in the sums (they never go down) as of its
last snapshot: a worker killed outright (``kill -9``, the OOM killer) loses what it counted since
(at most `SNAPSHOT_INTERVAL_S`, a second); one that exits writes its last snapshot first. Its
``mcc_worker_info`` sample and gauges leave (`_shared_metrics.retire`). A replacement is watched
like the rest while it starts: one that dies or is not ready within `START_TIMEOUT_S` is one more
death, and the supervisor keeps watching the others meanwhile. A worker that keeps dying
(`CRASH_LOOP` deaths within `CRASH_WINDOW_S`) is not restarted again: the supervisor stops the
others and exits 1, so the orchestrator restarts the pod and says so.

The metrics directory must be writable: the system's temporary directory, else ``/dev/shm``,
else the capture dir. With none (a read-only root filesystem and no capture dir), one sentence,
exit 2.
"""

from __future__ import annotations

import logging
import os
import shutil
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

import orjson

from ._serve import DRAINED_MARK, free_port, ready_line, ready_url
from ._settings import Settings
from ._shared_metrics import retire

log = logging.getLogger("mcc")

#: A worker that dies this many times within `CRASH_WINDOW_S` ends the supervisor (exit 1).
CRASH_LOOP = 5
CRASH_WINDOW_S = 60.0
#: A worker not ready this long after it started is taken for hung (an import, a mount) and killed.
START_TIMEOUT_S = 60.0


class NoMetricsDir(Exception):
    """No writable directory for the workers' metrics."""


def supervise_workers(settings: Settings, argv: list[str]) -> int:
    try:
        metrics_dir = make_metrics_dir(settings)
    except NoMetricsDir as exc:
        print(f"mcc: {exc}.", file=sys.stderr)
        return 2
    try:
        return _supervise(settings, argv, metrics_dir)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def make_metrics_dir(settings: Settings, candidates: Optional[list[str]] = None) -> str:
    """A fresh directory for the workers' metrics snapshots, in the first writable candidate."""
    if candidates is None:
        system_temp = _system_temp_dir()
        candidates = ([system_temp] if system_temp is not None else []) + ["/dev/shm"]
        if settings.capture_on and settings.capture_dir:
            candidates.append(settings.capture_dir)
    for parent in candidates:
        try:
            return tempfile.mkdtemp(prefix=".mcc-metrics-", dir=parent)
        except OSError:
            continue
    raise NoMetricsDir(f"--workers {settings.workers} needs a writable directory for the workers' metrics and found "
                       f"none ({', '.join(candidates)}): mount a writable volume at /tmp "
                       "(on Kubernetes with readOnlyRootFilesystem, an emptyDir), or set TMPDIR")


def _system_temp_dir() -> Optional[str]:
    """``tempfile.gettempdir()``, or None where it finds nothing writable: it raises then (every
    one of $TMPDIR, /tmp, /var/tmp and the working directory read-only), and the other
    candidates must still be tried."""
    try:
        return tempfile.gettempdir()
    except OSError:
        return None


class _Worker:
    """One worker process; ``ready`` is set when its ready line came (read on a thread of its own,
    so a worker hung while starting never blinds the supervisor to the others)."""

    def __init__(self, command: list[str], slot: int) -> None:
        self.slot = slot
        self.process = subprocess.Popen([*command, "--worker-index", str(slot)], stdout=subprocess.PIPE, text=True)
        self.pid = self.process.pid
        self.started = time.monotonic()
        self.ready = threading.Event()
        #: (finished, cut) the worker said it drained (`drained_line`), None until it did.
        self.drained: Optional[tuple[int, int]] = None
        self._reader = threading.Thread(target=self._read_output, daemon=True)
        self._reader.start()

    def _read_output(self) -> None:
        """Wait for the ready line (not shown: the supervisor prints its own), then pass the
        worker's later output through."""
        line = self.process.stdout.readline()  # type: ignore[union-attr]  # started with stdout=PIPE
        if ready_url(line) is None:
            return
        self.ready.set()
        for line in self.process.stdout:  # type: ignore[union-attr]  # started with stdout=PIPE
            if line.startswith(DRAINED_MARK):
                counts = orjson.loads(line[len(DRAINED_MARK):])
                self.drained = (counts["finished"], counts["cut"])
            else:
                sys.stdout.write(line)

    def drained_counts(self) -> Optional[tuple[int, int]]:
        """What the worker drained, once its output has ended (it has exited)."""
        self._reader.join(timeout=5)
        return self.drained

    def wait_ready(self, timeout: float) -> bool:
        """Ready within ``timeout``, or ended / stuck (then killed): False."""
        deadline = self.started + timeout
        while not self.ready.wait(0.05):
            if self.process.poll() is not None:
                return False
            if time.monotonic() > deadline:
                self.process.kill()
                return False
        return True

    def exit_description(self) -> str:
        code = self.process.wait()  # Reaped: a worker whose output ended may not be yet.
        return f"signal {-code}" if code < 0 else f"exit {code}"


class _Workers:
    """The worker processes, by slot (1..N); `start` starts a new one in a slot."""

    def __init__(self, command: list[str], count: int) -> None:
        self.command = command
        self.count = count
        self.workers: list[_Worker] = []

    @property
    def processes(self) -> list[subprocess.Popen]:
        return [worker.process for worker in self.workers]

    def start(self, slot: int) -> _Worker:
        worker = _Worker(self.command, slot)
        if slot <= len(self.workers):
            self.workers[slot - 1] = worker
        else:
            self.workers.append(worker)
        return worker


def _supervise(settings: Settings, argv: list[str], metrics_dir: str) -> int:
    port = settings.port or free_port(settings.host)
    # Every worker answers /-/metrics with the sum over all of them (`_shared_metrics`).
    command = [sys.executable, "-m", "proxy", *argv, "--workers", "1", "--port", str(port), "--reuse-port",
               "--metrics-dir", metrics_dir, "--worker-count", str(settings.workers)]
    workers = _Workers(command, settings.workers)
    if settings.redact_key is None and (settings.redact or settings.redact_hook):
        # One placeholder key for every worker (docs/privacy.md): a rollout's calls land on any of
        # them, and the same value must read as the same placeholder. In their environment, never
        # on a command line `ps` shows.
        os.environ["MCC_REDACT_KEY"] = secrets.token_hex(32)

    def share_weight_version(signum: int, frame: object) -> None:
        """A worker declared a weight version in the shared directory: every worker reads it."""
        for process in workers.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGUSR1)

    signal.signal(signal.SIGUSR1, share_weight_version)
    for slot in range(1, settings.workers + 1):
        worker = workers.start(slot)
        if not worker.wait_ready(START_TIMEOUT_S):
            _stop(workers.processes)
            how = worker.exit_description()
            stuck = time.monotonic() - worker.started > START_TIMEOUT_S
            print(f"mcc: a worker failed to start ({how}{', not ready within %gs' % START_TIMEOUT_S if stuck else ''})",
                  file=sys.stderr)
            code = worker.process.returncode
            return code if code == 2 else 1
    shown_host = f"[{settings.host}]" if ":" in settings.host else settings.host
    stopping = threading.Event()

    def forward(signum: int, frame: object) -> None:
        stopping.set()
        for process in workers.processes:
            if process.poll() is None:
                process.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)  # Before the ready line: a SIGTERM right after it is forwarded.
    signal.signal(signal.SIGINT, forward)
    log.info("%d workers on :%d (pids %s)", settings.workers, port, ", ".join(str(w.pid) for w in workers.workers),
             extra={"count": settings.workers})
    print(ready_line(f"http://{shown_host}:{port}", settings.log_format), flush=True)
    return _watch(workers, metrics_dir, stopping)


def _watch(workers: _Workers, metrics_dir: str, stopping: threading.Event) -> int:
    """Until every worker has ended after a stop: replace the ones that die on their own, and the
    replacements that die or hang while starting; `CRASH_LOOP` deaths in `CRASH_WINDOW_S` end it."""
    deaths: list[float] = []
    while True:
        if stopping.is_set():
            # A worker the forwarded signal ended before it could drain (still starting) stopped as asked.
            codes = [process.wait() for process in workers.processes]
            failed = [code for code in codes if code not in (0, -signal.SIGTERM, -signal.SIGINT)]
            code = 0 if not failed else max(max(failed), 1)
            _say_total(workers, code)
            return code
        for worker in list(workers.workers):
            if stopping.is_set():
                break
            how = _death(worker)
            if how is None:
                continue
            retire(metrics_dir, worker.pid)
            now = time.monotonic()
            deaths = [at for at in deaths if now - at < CRASH_WINDOW_S] + [now]
            slot, count = worker.slot, workers.count
            if len(deaths) >= CRASH_LOOP:
                log.error("worker %d/%d (pid %d) %s: %d deaths in %gs, giving up: stopping the other workers "
                          "and exiting 1 so the orchestrator restarts the pod", slot, count, worker.pid, how,
                          len(deaths), CRASH_WINDOW_S)
                stopping.set()
                _stop([process for process in workers.processes if process.poll() is None])
                return 1
            replacement = workers.start(slot)
            log.error("worker %d/%d (pid %d) %s: its in-flight calls are lost; restarted as pid %d",
                      slot, count, worker.pid, how, replacement.pid)
        time.sleep(0.1)


def _say_total(workers: _Workers, code: int) -> None:
    """The supervisor's last line: every worker's drain added up (each said its own)."""
    counts = [worker.drained_counts() for worker in workers.workers]
    finished = sum(c[0] for c in counts if c is not None)
    cut = sum(c[1] for c in counts if c is not None)
    silent = sum(1 for c in counts if c is None)
    log.info("all %d workers stopped: %d call%s finished, %d cut%s; exit %d", len(counts), finished,
             "" if finished == 1 else "s", cut, f"; {silent} ended without draining" if silent else "", code,
             extra={"count": finished})


def _death(worker: _Worker) -> Optional[str]:
    """How ``worker`` died (``died (signal 9)``, ``hung while starting ...``), None while it lives."""
    if worker.process.poll() is not None:
        how = f"died ({worker.exit_description()})"
        return how if worker.ready.is_set() else how + " while starting"
    if not worker.ready.is_set() and time.monotonic() - worker.started > START_TIMEOUT_S:
        worker.process.kill()
        worker.process.wait()
        return f"was not ready within {START_TIMEOUT_S:g}s of starting (a hung import or mount?) and was killed"
    return None


def _stop(workers: list[subprocess.Popen], timeout: Optional[float] = 30) -> None:
    for worker in workers:
        worker.terminate()
    for worker in workers:
        try:
            worker.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
