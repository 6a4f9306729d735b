"""Persisting capture lines off the event loop, and what happens when that fails (DESIGN §3, §5).

Serialisation and the fsync'ed append run in a small thread pool so the event loop keeps pumping
other calls' bytes. A failure never reaches the client: it is logged once per rollout and kind,
counted, and the rollout is marked ``.capture.incomplete`` where the disk still allows it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from capture import append_capture_line, create_incomplete_marker
from records import capture_path, encode_capture_line, incomplete_marker_path

from ._exchange import CallExchange
from ._metrics import SidecarMetrics

log = logging.getLogger("mcc.capture")

#: fsync is disk-bound, not CPU-bound: a few threads keep several rollouts' appends in flight.
CAPTURE_THREADS = 8


class CaptureWriter:
    """Appends one line per call to ``<capture_dir>/<rollout_id>.capture.jsonl``."""

    def __init__(self, capture_dir: str, metrics: SidecarMetrics, threads: int = CAPTURE_THREADS) -> None:
        self.capture_dir = capture_dir
        self._metrics = metrics
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mcc-capture")
        self._logged: set[tuple[str, str]] = set()
        self.lines_written = 0
        self.failures: Counter[str] = Counter()

    async def persist(self, exchange: CallExchange) -> bool:
        """Build, serialise and durably append the call's line; False (never raise) on failure."""
        loop = asyncio.get_running_loop()
        try:
            size, fsync_seconds = await loop.run_in_executor(self._executor, self._write, exchange)
        except Exception as exc:
            await self._on_failure(exchange.rollout_id, exc)
            return False
        self.lines_written += 1
        self._metrics.capture_lines.inc()
        self._metrics.capture_bytes.inc(size)
        self._metrics.fsync_duration.observe(fsync_seconds)
        return True

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def _write(self, exchange: CallExchange) -> tuple[int, float]:
        line = encode_capture_line(exchange.capture_fields())
        return len(line), append_capture_line(capture_path(self.capture_dir, exchange.rollout_id), line)

    async def _on_failure(self, rollout_id: str, exc: Exception) -> None:
        kind = failure_kind(exc)
        self.failures[kind] += 1
        self._metrics.capture_failures.labels(kind).inc()
        if (rollout_id, kind) not in self._logged:
            self._logged.add((rollout_id, kind))
            log.error("capture failed for rollout %s (%s): %s; the call was forwarded unchanged, "
                      "further %s failures of this rollout are only counted", rollout_id, kind, exc, kind)
        marker = incomplete_marker_path(self.capture_dir, rollout_id)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, create_incomplete_marker, marker)
        except Exception:
            pass  # The directory may be gone or read-only; the failure is already counted.


def failure_kind(exc: BaseException) -> str:
    """A short stable name for a capture failure: the errno name for OS errors."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, f"errno{exc.errno}")
    return type(exc).__name__
