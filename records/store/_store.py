"""`CaptureStore`: the read side of the capture file contract (docs/files.md).

Reads take a shared ``flock`` so they never see a half-appended line from a live writer on the
same host; a torn last line left by a crash is skipped by the tolerant reader and reported.

``call_index`` is a line's position in its file (0-based, blank lines not counted): durable
append order. A malformed line keeps its position, so indexes never shift between readers.
"""

from __future__ import annotations

import fcntl
import gc
import io
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import orjson

from ..contract import create_incomplete_marker
from ..contract.reading import append_capture_line
from ..contract import START_INDEX, add_to_index
from ..contract.reading import MalformedCaptureLine
from ..contract import CAPTURE_SUFFIX, INCOMPLETE_SUFFIX, capture_path, encode_capture_line, incomplete_marker_path
from ..contract.reading import is_store_url
from ._paths import directory_of
from ..contract import is_valid_rollout_id


@dataclass
class ReadResult:
    """What the tolerant reader found in one capture file."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    #: ``call_index`` of each entry of ``lines``.
    call_indexes: list[int] = field(default_factory=list)
    #: ``call_index`` of every line that was not one JSON object (a torn last line included).
    malformed_indexes: list[int] = field(default_factory=list)
    #: True when the file did not end with a newline: a crash interrupted the last append.
    torn_last_line: bool = False

    @property
    def malformed(self) -> int:
        return len(self.malformed_indexes)

    def __iter__(self) -> Iterator[Any]:
        """Unpacks as NeMo Gym's ``read_available`` result, ``([(call_index, line), ...], unreadable)``,
        so Gym's own ``read_available_model_call_records(store, rollout_id)`` reads a `CaptureStore`."""
        yield list(zip(self.call_indexes, self.lines))
        yield self.malformed


def capture_store(where: object, taker: str) -> "CaptureStore":
    """``where`` as a `CaptureStore`: itself, or the store of the directory it names (`directory_of`)."""
    return where if isinstance(where, CaptureStore) else CaptureStore(directory_of(where, taker))


class CaptureStore:
    """A directory of ``<rollout_id>.capture.jsonl`` files (NeMo Gym's ``CaptureStore`` surface).

    Unlike Gym's, constructing one never creates the directory: a reader of a mistyped path
    should find nothing, not leave an empty directory behind.
    """

    def __init__(self, capture_dir: str | os.PathLike[str], *, allow_empty: bool = False) -> None:
        """``capture_dir``: a directory, or a capture store's URL (read as its view of Gym's files;
        a URL where nothing is raises `StoreNotFound`, unless ``allow_empty``)."""
        #: The store URL this was opened with (messages name it, not the view's cache path), or None.
        self.url = capture_dir if isinstance(capture_dir, str) and is_store_url(capture_dir) else None
        self.capture_dir = directory_of(capture_dir, "CaptureStore", allow_empty)

    @property
    def where(self) -> str:
        """What to call this store in a message: its URL, else its directory."""
        return self.url or self.capture_dir

    def __fspath__(self) -> str:
        """A store is a path-like of its directory: every reader takes either (`directory_of`)."""
        return self.capture_dir

    @property
    def root(self) -> Path:
        """The capture directory."""
        return Path(self.capture_dir)

    def path_for(self, rollout_id: str) -> Path:
        """The capture file of ``rollout_id``; raises `InvalidRolloutId` for an invalid id."""
        return Path(capture_path(self.capture_dir, rollout_id))

    def incomplete_path_for(self, rollout_id: str) -> Path:
        """The ``.capture.incomplete`` marker of ``rollout_id`` (Gym's name)."""
        return Path(incomplete_marker_path(self.capture_dir, rollout_id))

    def incomplete_marker_for(self, rollout_id: str) -> str:
        return incomplete_marker_path(self.capture_dir, rollout_id)

    def record(self, rollout_id: str, exchange: Mapping[str, Any]) -> None:
        """Append one exchange as a capture line under the file contract (``flock``, one ``write``,
        ``fsync``): in-process harnesses and tests write captures without the sidecar. Core keys
        come first in the contract's order; blocking, so run it off an event loop."""
        path = capture_path(self.capture_dir, rollout_id)
        new = not os.path.exists(path)
        append_capture_line(path, encode_capture_line(exchange, default=str))
        if new:  # Its start, where a rollout with calls and no end is found (docs/reading.md).
            add_to_index(self.capture_dir, START_INDEX, time.time(), rollout_id, durable=False)

    def read(self, rollout_id: str) -> list[dict[str, Any]]:
        """Every line of the rollout's file, in append order; raises `MalformedCaptureLine` (also an
        ``orjson.JSONDecodeError``) on any malformed line."""
        path = capture_path(self.capture_dir, rollout_id)
        lines = []
        with gc_paused():
            for call_index, parsed in _parsed_lines(_read_locked(path)):
                if parsed is None:
                    raise MalformedCaptureLine(path, call_index + 1, "not one JSON object ending in a newline")
                lines.append(parsed)
        return lines

    def read_available(self, rollout_id: str) -> ReadResult:
        """Every intact line; malformed lines and a torn last line are skipped and reported.

        ``pairs, unreadable = store.read_available(rollout_id)`` works too, as with Gym's store."""
        data = _read_locked(self.path_for(rollout_id))
        result = ReadResult(torn_last_line=bool(data) and not data.endswith(b"\n"))
        with gc_paused():
            for call_index, parsed in _parsed_lines(data):
                if parsed is None:
                    result.malformed_indexes.append(call_index)
                else:
                    result.lines.append(parsed)
                    result.call_indexes.append(call_index)
        return result

    def iter_available(self, rollout_id: str) -> Iterator[tuple[int, dict[str, Any] | None]]:
        """``(call_index, line)`` for every line, ``line`` None when malformed or torn.

        What `read_available` collects, one line at a time: a reader that turns each line into
        something smaller (a record, a table row, a running total) keeps only that, and the
        parse of the next line reuses the memory of the last (see `_parsed_lines`).
        """
        return _parsed_lines(_read_locked(self.path_for(rollout_id)))

    def iter_raw_lines(self, rollout_id: str) -> Iterator[tuple[int, bytes | None]]:
        """``(call_index, line)`` for every line, unparsed (``line`` None when torn): for a reader
        that parses lines its own way and must number them as `iter_available` does."""
        return enumerate(complete_lines(_read_locked(self.path_for(rollout_id))))

    def rollout_ids(self) -> list[str]:
        """The ids of every rollout in the directory, sorted: those with a capture file, and those
        with only an incomplete marker (every line of theirs was lost: a reader must still show
        them, as incomplete, or the loss goes unseen)."""
        try:
            names = os.listdir(self.capture_dir)
        except FileNotFoundError:
            raise FileNotFoundError(f"capture dir {self.capture_dir} does not exist (a wrong path or an unmounted "
                                    "volume?)") from None
        ids = {name[: -len(suffix)] for name in names for suffix in (CAPTURE_SUFFIX, INCOMPLETE_SUFFIX)
               if name.endswith(suffix)}
        return sorted(rid for rid in ids if is_valid_rollout_id(rid))

    def clear(self, rollout_ids: Iterable[str]) -> None:
        """Remove the capture file and incomplete marker of exactly these rollout ids, and their
        training-token files beside them (a reused id must not add calls to an earlier attempt's
        chain; with ``--token-dir`` elsewhere, `records.store.clear_token_captures` clears those)."""
        if isinstance(rollout_ids, (str, bytes)):
            raise TypeError("rollout_ids must be a collection of rollout ids, not one string")
        from ..contract import TokenFiles
        from ..contract.reading import TOKENS_SUFFIX
        tokens = TokenFiles(self.capture_dir)
        for rollout_id in rollout_ids:
            for path in (self.path_for(rollout_id), self.incomplete_marker_for(rollout_id)):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            if os.path.exists(tokens.path(rollout_id, ".tokens.lock")) or os.path.exists(tokens.path(rollout_id, TOKENS_SUFFIX)):
                tokens.delete(rollout_id)

    def mark_incomplete(self, rollout_id: str) -> None:
        """Create the empty ``.capture.incomplete`` marker of a rollout."""
        create_incomplete_marker(self.incomplete_marker_for(rollout_id))

    def is_incomplete(self, rollout_id: str) -> bool:
        return os.path.exists(self.incomplete_marker_for(rollout_id))


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector during a bulk parse.

    Parsing a file allocates millions of dicts and lists; each allocation burst triggers a GC
    pass that rescans every container still alive, so reading slows down as it goes. Parsed
    JSON cannot form reference cycles, so nothing is missed; reference counting still frees
    everything. The collector's previous state is restored afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _read_locked(path: "str | os.PathLike[str]") -> bytes:
    """The whole file read under ``LOCK_SH``; empty when it does not exist (a rollout without calls).

    A capture directory that does not exist is said so (`FileNotFoundError`): a collector with a
    wrong mount must fail, not read every rollout as empty.
    """
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        directory = os.path.dirname(path) or "."
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"capture dir {directory} does not exist (a wrong path or an unmounted volume?)") from None
        return b""
    with handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
        try:
            return handle.read()
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _parsed_lines(data: bytes) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(call_index, parsed object or None) for every non-blank line of ``data``.

    The file is read in blocks of whole lines (about 1 MiB), each parsed as one JSON array when
    it can be (`_parse_as_one_array`), else line by line. Never split up front: a split copies
    the whole file into line objects that all stay alive until the last one is parsed, and on
    a 100,000-line file that is hundreds of MB of fresh memory, which costs more in page faults
    than the parse itself (issue 4's measurements); a block's memory is reused by the next.
    """
    index = 0
    for block in _blocks(data):
        values = _parse_as_one_array(block) if block.endswith(b"\n") else None
        if values is not None:
            for value in values:
                yield index, (value if type(value) is dict else None)
                index += 1
            continue
        for parsed in _parse_line_by_line(block):
            yield index, parsed
            index += 1


def _blocks(data: bytes) -> Iterator[bytes]:
    """``data`` in pieces of about `_BLOCK_BYTES`, each ending at a line end (but the last)."""
    start, size = 0, len(data)
    while start < size:
        stop = data.find(b"\n", min(start + _BLOCK_BYTES, size) - 1)
        stop = size if stop == -1 else stop + 1
        yield data[start:stop] if start or stop < size else data
        start = stop


def _parse_line_by_line(block: bytes) -> Iterator[dict[str, Any] | None]:
    """Each non-blank line of ``block``: its object, or None when malformed or torn."""
    loads, decode_error = orjson.loads, orjson.JSONDecodeError
    for line in complete_lines(block):
        parsed: Any = None
        if line is not None:
            try:
                parsed = loads(line)  # The LF is JSON whitespace.
            except decode_error:
                pass
        yield parsed if type(parsed) is dict else None


def complete_lines(data: bytes) -> Iterator[bytes | None]:
    """Each non-blank line of ``data`` with its LF, or None for a last line without its LF: it is
    torn (docs/files.md). The lines a reader numbers (``call_index``) and parses, unparsed."""
    for line in io.BytesIO(data):  # Shares the buffer; finds each line in C.
        if line[0] in _BLANK and not line.strip():
            continue
        yield line if line[-1] == _LF else None


_LF = ord("\n")
#: Lines are parsed in blocks of about this many bytes (see `_parsed_lines`).
_BLOCK_BYTES = 1 << 20


def _parse_as_one_array(data: bytes) -> list[Any] | None:
    """Every line of ``data`` at once, when each is one JSON value and none is blank.

    The lines joined by commas are one JSON array, parsed in one call to orjson instead of one
    per line (+15% for `mcc stats`). Anything else -- a blank line, a malformed or torn line,
    a line holding two values -- gives None, and the block is read line by line, so the result
    is always the same.
    """
    try:
        values = orjson.loads(b"[" + data[:-1].replace(b"\n", b",") + b"]")
    except orjson.JSONDecodeError:
        return None
    return values if len(values) == data.count(b"\n") else None
_BLANK = b" \t\r\n"
