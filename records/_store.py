"""`CaptureStore`: the read side of the capture file contract (DESIGN §3).

Reads take a shared ``flock`` so they never see a half-appended line from a live writer on the
same host; a torn last line left by a crash is skipped by the tolerant reader and counted.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

import orjson

from ._errors import MalformedCaptureLine
from ._file_contract import (
    CAPTURE_SUFFIX,
    capture_path,
    incomplete_marker_path,
)
from ._rollout_ids import is_valid_rollout_id


@dataclass
class ReadResult:
    """What the tolerant reader found in one capture file."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    #: 1-based line numbers of lines that were not one JSON object (including a torn last line).
    malformed_line_numbers: list[int] = field(default_factory=list)
    #: True when the file did not end with a newline: a crash interrupted the last append.
    torn_last_line: bool = False

    @property
    def malformed(self) -> int:
        return len(self.malformed_line_numbers)


class CaptureStore:
    """A directory of ``<rollout_id>.capture.jsonl`` files."""

    def __init__(self, capture_dir: str | os.PathLike[str]) -> None:
        self.capture_dir = os.fspath(capture_dir)

    def path_for(self, rollout_id: str) -> str:
        """The capture file of ``rollout_id`` (which must be a valid id)."""
        return capture_path(self.capture_dir, rollout_id)

    def incomplete_marker_for(self, rollout_id: str) -> str:
        return incomplete_marker_path(self.capture_dir, rollout_id)

    def read(self, rollout_id: str) -> list[dict[str, Any]]:
        """Every line of the rollout's file, in append order; raises on any malformed line."""
        path = self.path_for(rollout_id)
        lines = []
        for number, raw in enumerate(_read_locked(path).splitlines(keepends=True), start=1):
            parsed = _parse_line(raw)
            if parsed is None:
                raise MalformedCaptureLine(path, number, "not one JSON object ending in a newline")
            lines.append(parsed)
        return lines

    def read_available(self, rollout_id: str) -> ReadResult:
        """Every intact line; malformed lines and a torn last line are skipped and reported."""
        result = ReadResult()
        data = _read_locked(self.path_for(rollout_id))
        result.torn_last_line = bool(data) and not data.endswith(b"\n")
        for number, raw in enumerate(data.splitlines(keepends=True), start=1):
            parsed = _parse_line(raw)
            if parsed is None:
                result.malformed_line_numbers.append(number)
            else:
                result.lines.append(parsed)
        return result

    def rollout_ids(self) -> list[str]:
        """The ids of every capture file in the directory, sorted."""
        try:
            names = os.listdir(self.capture_dir)
        except FileNotFoundError:
            return []
        ids = (name[: -len(CAPTURE_SUFFIX)] for name in names if name.endswith(CAPTURE_SUFFIX))
        return sorted(rid for rid in ids if is_valid_rollout_id(rid))

    def clear(self, rollout_ids: Iterable[str]) -> None:
        """Remove the capture file and incomplete marker of exactly these rollout ids."""
        for rollout_id in rollout_ids:
            for path in (self.path_for(rollout_id), self.incomplete_marker_for(rollout_id)):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def mark_incomplete(self, rollout_id: str) -> None:
        """Create the empty ``.capture.incomplete`` marker of a rollout."""
        with open(self.incomplete_marker_for(rollout_id), "ab"):
            pass

    def is_incomplete(self, rollout_id: str) -> bool:
        return os.path.exists(self.incomplete_marker_for(rollout_id))


def _read_locked(path: str) -> bytes:
    """The whole file read under ``LOCK_SH``; empty when it does not exist."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return b""
    with handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
        try:
            return handle.read()
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _parse_line(raw: bytes) -> dict[str, Any] | None:
    """One complete line as a dict, or None when torn or not a JSON object."""
    if not raw.endswith(b"\n"):
        return None
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None
