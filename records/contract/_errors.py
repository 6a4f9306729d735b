"""Exceptions of the `records` package.

    RecordsError            base of everything this package raises
     +-- InvalidRolloutId   a rollout id that breaks the file contract's rule (docs/files.md)
     +-- MalformedCaptureLine  a line the strict reader could not parse
     +-- StoreNotFound      a store URL with no manifest and no writer ever seen there
     +-- NothingUploadedYet a store its sidecars write to, with nothing uploaded yet
"""

from __future__ import annotations

import orjson


class RecordsError(Exception):
    """Base class of the errors raised by the `records` package."""


class InvalidRolloutId(RecordsError, ValueError):
    """A rollout id that does not match ``^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$``."""


class MalformedCaptureLine(RecordsError, orjson.JSONDecodeError):
    """A capture line that is not one JSON object (raised by the strict reader only).

    Also an ``orjson.JSONDecodeError`` (so a ``json.JSONDecodeError`` and a ``ValueError``), as
    NeMo Gym's reader raises, so code written against Gym catches it unchanged.
    """

    def __init__(self, path: str, line_number: int, reason: str, line: str = "") -> None:
        message = f"{path}:{line_number}: {reason}"
        orjson.JSONDecodeError.__init__(self, message, line, 0)
        self.args = (message,)  # JSONDecodeError appends "line 1 column 1 (char 0)": not ours.
        self.path = path
        self.line_number = line_number
        self.reason = reason

    def __str__(self) -> str:
        return self.args[0]

    def __reduce__(self):
        return (type(self), (self.path, self.line_number, self.reason, self.doc))


class StoreNotFound(RecordsError, FileNotFoundError):
    """A capture store URL where no manifest is and no sidecar ever wrote: a typo in the URL, the
    wrong bucket or prefix (a reader that read it as an empty run would hide that). Read with
    ``allow_empty=True`` (``--allow-empty``) where a store may not exist yet."""


class NothingUploadedYet(StoreNotFound):
    """A capture store its sidecars write to (their watermark objects are there) where no segment
    is uploaded yet: one is once sealed (``--segment-max-age``, 60 s by default)."""
