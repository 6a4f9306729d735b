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
exit of the whole pod would cut too. Its counters stay in the sums (they never go down); its
``mcc_worker_info`` sample and gauges leave (`_shared_metrics.retire`). A worker that keeps
dying (`CRASH_LOOP` deaths within `CRASH_WINDOW_S`) is not restarted again: the supervisor
stops the others and exits 1, so the orchestrator restarts the pod and says so.

The metrics directory must be writable: the system's temporary directory, else ``/dev/shm``,
else the capture dir. With none (a read-only root filesystem and no capture dir), one sentence,
exit 2.
"""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

from ._server import free_port, ready_line, ready_url
from ._settings import Settings
from ._shared_metrics import retire

log = logging.getLogger("mcc")

#: A worker that dies this many times within `CRASH_WINDOW_S` ends the supervisor (exit 1).
CRASH_LOOP = 5
CRASH_WINDOW_S = 60.0


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
        candidates = [tempfile.gettempdir(), "/dev/shm"]
        if settings.capture_on and settings.capture_dir:
            candidates.append(settings.capture_dir)
    for parent in candidates:
        try:
            return tempfile.mkdtemp(prefix=".mcc-metrics-", dir=parent)
        except OSError:
            continue
    raise NoMetricsDir(f"--workers {settings.workers} needs a writable directory for the workers' metrics and found "
                       f"none ({', '.join(candidates)}): mount a writable volume at {tempfile.gettempdir()} "
                       "(on Kubernetes with readOnlyRootFilesystem, an emptyDir), or set TMPDIR")


class _Workers:
    """The worker processes, by slot (1..N); `replace` starts a new one in a slot."""

    def __init__(self, command: list[str], count: int) -> None:
        self.command = command
        self.count = count
        self.processes: list[subprocess.Popen] = []

    def start(self, slot: int) -> subprocess.Popen:
        process = subprocess.Popen([*self.command, "--worker-index", str(slot)], stdout=subprocess.PIPE, text=True)
        if slot <= len(self.processes):
            self.processes[slot - 1] = process
        else:
            self.processes.append(process)
        return process


def _supervise(settings: Settings, argv: list[str], metrics_dir: str) -> int:
    port = settings.port or free_port(settings.host)
    # Every worker answers /-/metrics with the sum over all of them (`_shared_metrics`).
    command = [sys.executable, "-m", "proxy", *argv, "--workers", "1", "--port", str(port), "--reuse-port",
               "--metrics-dir", metrics_dir, "--worker-count", str(settings.workers)]
    workers = _Workers(command, settings.workers)
    for slot in range(1, settings.workers + 1):
        worker = workers.start(slot)
        if not _wait_ready(worker):
            _stop(workers.processes)
            code = worker.wait()
            print(f"mcc: a worker failed to start (exit {code})", file=sys.stderr)
            return code if code == 2 else 1
    shown_host = f"[{settings.host}]" if ":" in settings.host else settings.host
    stopping = threading.Event()

    def forward(signum: int, frame: object) -> None:
        stopping.set()
        for worker in workers.processes:
            if worker.poll() is None:
                worker.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)  # Before the ready line: a SIGTERM right after it is forwarded.
    signal.signal(signal.SIGINT, forward)
    log.info("%d workers on :%d (pids %s)", settings.workers, port, ", ".join(str(w.pid) for w in workers.processes),
             extra={"count": settings.workers})
    print(ready_line(f"http://{shown_host}:{port}", settings.log_format), flush=True)
    return _watch(workers, metrics_dir, stopping)


def _watch(workers: _Workers, metrics_dir: str, stopping: threading.Event) -> int:
    """Until every worker has ended after a stop: replace the ones that die on their own."""
    deaths: list[float] = []
    while True:
        if stopping.is_set():
            # A worker the forwarded signal ended before it could drain (still starting) stopped as asked.
            codes = [worker.wait() for worker in workers.processes]
            failed = [code for code in codes if code not in (0, -signal.SIGTERM, -signal.SIGINT)]
            return 0 if not failed else max(max(failed), 1)
        for slot, worker in enumerate(list(workers.processes), start=1):
            code = worker.poll()
            if code is None or stopping.is_set():
                continue
            how = f"signal {-code}" if code < 0 else f"exit {code}"
            retire(metrics_dir, worker.pid)
            now = time.monotonic()
            deaths = [at for at in deaths if now - at < CRASH_WINDOW_S] + [now]
            if len(deaths) >= CRASH_LOOP:
                log.error("worker %d/%d (pid %d) died (%s): %d deaths in %gs, giving up: stopping the other workers "
                          "and exiting 1 so the orchestrator restarts the pod", slot, workers.count, worker.pid, how,
                          len(deaths), CRASH_WINDOW_S)
                stopping.set()
                _stop([w for w in workers.processes if w.poll() is None])
                return 1
            replacement = workers.start(slot)
            log.error("worker %d/%d (pid %d) died (%s): its in-flight calls are lost; restarted as pid %d",
                      slot, workers.count, worker.pid, how, replacement.pid)
            if not _wait_ready(replacement):
                log.error("worker %d/%d did not start again (exit %s): exiting 1", slot, workers.count,
                          replacement.poll())
                stopping.set()
                _stop([w for w in workers.processes if w.poll() is None])
                return 1
        time.sleep(0.1)


def _wait_ready(worker: subprocess.Popen) -> bool:
    """Read the worker's ready line (not shown: the supervisor prints its own), then pass its
    later output through."""
    line = worker.stdout.readline()  # type: ignore[union-attr]
    if ready_url(line) is None:
        return False
    threading.Thread(target=_pass_through, args=(worker,), daemon=True).start()
    return True


def _pass_through(worker: subprocess.Popen) -> None:
    for line in worker.stdout:  # type: ignore[union-attr]
        sys.stdout.write(line)


def _stop(workers: list[subprocess.Popen], timeout: Optional[float] = 30) -> None:
    for worker in workers:
        worker.terminate()
    for worker in workers:
        try:
            worker.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
