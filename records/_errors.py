"""Exceptions of the `records` package.

    RecordsError            base of everything this package raises
     +-- InvalidRolloutId   a rollout id that breaks the file contract's rule (DESIGN §3)
     +-- MalformedCaptureLine  a line the strict reader could not parse
"""

from __future__ import annotations


class RecordsError(Exception):
    """Base class of the errors raised by the `records` package."""


class InvalidRolloutId(RecordsError, ValueError):
    """A rollout id that does not match ``^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$``."""


class MalformedCaptureLine(RecordsError, ValueError):
    """A capture line that is not one JSON object (raised by the strict reader only)."""

    def __init__(self, path: str, line_number: int, reason: str) -> None:
        super().__init__(f"{path}:{line_number}: {reason}")
        self.path = path
        self.line_number = line_number
        self.reason = reason
