"""``mcc serve --workers N``: N sidecar processes on one port (``SO_REUSEPORT``), one event loop
each, so one sidecar can use a whole node. The kernel spreads new connections over the workers.

The supervisor re-runs the same command line once per worker with ``--workers 1 --port P
--reuse-port`` appended (the last occurrence of a flag wins), waits for every worker's ready
line, prints its own, forwards SIGTERM / SIGINT and exits with the workers' worst exit status.
Workers append to the same capture files safely: the file contract locks each append. They
share their metrics through a directory the supervisor makes, so every scrape of the port sees
the sum over all workers (`_shared_metrics`).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import threading

from ._server import free_port, ready_line, ready_url
from ._settings import Settings


def supervise_workers(settings: Settings, argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="mcc-metrics-") as metrics_dir:
        return _supervise(settings, argv, metrics_dir)


def _supervise(settings: Settings, argv: list[str], metrics_dir: str) -> int:
    port = settings.port or free_port(settings.host)
    # Every worker answers /-/metrics with the sum over all of them (`_shared_metrics`).
    command = [sys.executable, "-m", "proxy", *argv, "--workers", "1", "--port", str(port), "--reuse-port",
               "--metrics-dir", metrics_dir]
    workers = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(settings.workers)]
    for worker in workers:
        line = worker.stdout.readline()  # type: ignore[union-attr]
        if ready_url(line) is None:
            _stop(workers)
            code = worker.wait()
            print(f"mcc: a worker failed to start (exit {code})", file=sys.stderr)
            return code if code == 2 else 1
        threading.Thread(target=_pass_through, args=(worker,), daemon=True).start()
    shown_host = f"[{settings.host}]" if ":" in settings.host else settings.host
    stopping = threading.Event()

    def forward(signum: int, frame: object) -> None:
        stopping.set()
        for worker in workers:
            worker.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)  # Before the ready line: a SIGTERM right after it is forwarded.
    signal.signal(signal.SIGINT, forward)
    print(ready_line(f"http://{shown_host}:{port}", settings.log_format), flush=True)
    codes = [worker.wait() for worker in workers]
    return max(codes) if not stopping.is_set() or any(codes) else 0


def _pass_through(worker: subprocess.Popen) -> None:
    for line in worker.stdout:  # type: ignore[union-attr]
        sys.stdout.write(line)


def _stop(workers: list[subprocess.Popen]) -> None:
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.wait(timeout=30)
