"""A warning repeated by every call while its cause lasts, said once a while with a count (issue 21)."""

from __future__ import annotations

import logging
import time


class RepeatLimiter:
    """Says a repeated warning once per ``interval`` seconds, with how many times it happened meanwhile.

    An upstream that is down fails every call; one line per call would flood the log. The first
    occurrence of a key is logged, later ones within the interval are counted, and the next one
    logged after it says ``(N more in the last Ts)`` and carries ``count`` in JSON lines.
    """

    def __init__(self, logger: logging.Logger, interval: float = 10.0) -> None:
        self.logger, self.interval = logger, interval
        self._last: dict[object, float] = {}
        self._suppressed: dict[object, int] = {}

    def warning(self, key: object, message: str, *args: object, extra: dict[str, object] | None = None) -> None:
        self.log(logging.WARNING, key, message, *args, extra=extra)

    def error(self, key: object, message: str, *args: object, extra: dict[str, object] | None = None) -> None:
        self.log(logging.ERROR, key, message, *args, extra=extra)

    def log(self, level: int, key: object, message: str, *args: object, extra: dict[str, object] | None = None) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        suppressed = self._suppressed.pop(key, 0)
        self._last[key] = now
        if suppressed:
            message += f" ({suppressed} more in the last {self.interval:g}s)"
        self.logger.log(level, message, *args, extra={**(extra or {}), "count": suppressed + 1})
