"""Persisting capture lines off the event loop, and what happens when that fails (DESIGN §3, §5).

Serialisation and the durable append run on one writer thread with group commit
(`capture.GroupCommitter`): the event loop keeps pumping other calls' bytes, and the lines of
calls that end together share one durability barrier. A failure never reaches the client: it is
logged once per rollout and kind, counted, and the rollout is marked ``.capture.incomplete``
where the disk still allows it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections import Counter

from capture import GroupCommitter, create_incomplete_marker
from records import capture_path, encode_capture_line, incomplete_marker_path

from ._exchange import CallExchange
from ._metrics import SidecarMetrics

log = logging.getLogger("mcc.capture")


class CaptureWriter:
    """Appends one line per call to ``<capture_dir>/<rollout_id>.capture.jsonl``."""

    def __init__(self, capture_dir: str, metrics: SidecarMetrics, sync_mode: str = "auto") -> None:
        self.capture_dir = capture_dir
        self._metrics = metrics
        self._committer = GroupCommitter(sync_mode)
        self._logged: set[tuple[str, str]] = set()
        self.lines_written = 0
        self.failures: Counter[str] = Counter()

    async def persist(self, exchange: CallExchange) -> bool:
        """Build, serialise and durably append the call's line; False (never raise) on failure."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[int, object]] = loop.create_future()

        def done(size: int, outcome: object) -> None:  # On the writer thread.
            loop.call_soon_threadsafe(_settle, future, (size, outcome))

        try:
            path = capture_path(self.capture_dir, exchange.rollout_id)
            self._committer.submit(path, lambda: encode_capture_line(exchange.capture_fields()), done)
            size, outcome = await asyncio.shield(future)  # A cancelled handler still learns the outcome.
        except Exception as exc:
            outcome = exc
        if isinstance(outcome, BaseException):
            await self._on_failure(exchange.rollout_id, outcome)
            return False
        self.lines_written += 1
        self._metrics.capture_lines.inc()
        self._metrics.capture_bytes.inc(size)
        self._metrics.fsync_duration.observe(outcome)  # type: ignore[arg-type]
        return True

    def close(self) -> None:
        self._committer.close()

    async def _on_failure(self, rollout_id: str, exc: BaseException) -> None:
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
            await loop.run_in_executor(None, create_incomplete_marker, marker)
        except Exception:
            pass  # The directory may be gone or read-only; the failure is already counted.


def failure_kind(exc: BaseException) -> str:
    """A short stable name for a capture failure: the errno name for OS errors."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, f"errno{exc.errno}")
    return type(exc).__name__


def _settle(future: "asyncio.Future[tuple[int, object]]", result: tuple[int, object]) -> None:
    if not future.done():
        future.set_result(result)
