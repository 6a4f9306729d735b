"""Time-ordered indexes of a capture directory or store: what a reader lists from a point, so that
a long run's history is never listed again (docs/reading.md, "At a long run's scale").

Two indexes, one entry per fact, each an empty file (a directory) or object (a store):

- ``end-index/<minute>/<ns>-<rollout_id>``: a rollout's end, stamped with its ``ended_at``. It is
  written **before** the end itself (`write_rollout_end`), so an end that exists always has its
  entry; an entry whose end never came (its writer died between the two, unanswered) or is another
  (a racing writer's end won) stands for nothing: a reader checks each entry against the end.
- ``start-index/<minute>/<ns>-<rollout_id>``: a rollout's first line in a capture file (a directory:
  the writer that created the file) or its first segment in a store (the uploader that first named
  it): what "a rollout with calls and no end" is found from.

``<minute>`` (Unix minutes) and ``<ns>`` (Unix nanoseconds) are zero-padded, so names sort by time:
a store lists them with a start-after (`ObjectStore.names_after`), a directory reads only the
minutes from the point on. An entry lands within `INDEX_LAG_SECONDS` of its stamp (the write's own
time and the clocks' skew between nodes, which NTP keeps to milliseconds): a reader lists from its
cursor less that, and a consumer's checkpoint keeps its cursor that far behind its own clock.
"""

from __future__ import annotations

import os
from typing import Optional

from ._appender import fsync_directory
from ._object_store import ObjectStore, walk_names_after
from ._rollout_ids import is_valid_rollout_id

END_INDEX = "end-index"
START_INDEX = "start-index"
#: An index entry lands within this many seconds of its stamp (see the module's docstring).
INDEX_LAG_SECONDS = 60.0
_NS = 1_000_000_000
_MINUTE_NS = 60 * _NS


def _stamp_ns(stamp: float) -> int:
    return int(round(stamp * _NS))


def index_name(kind: str, stamp: float, rollout_id: str) -> str:
    """The entry of ``rollout_id`` stamped ``stamp`` (Unix seconds) in the index ``kind``."""
    ns = _stamp_ns(stamp)
    return f"{kind}/{ns // _MINUTE_NS:010d}/{ns:020d}-{rollout_id}"


def index_point(kind: str, stamp: float) -> str:
    """A name that sorts after every entry stamped before ``stamp`` and before every other."""
    ns = _stamp_ns(max(0.0, stamp))
    return f"{kind}/{ns // _MINUTE_NS:010d}/{ns:020d}"


def same_stamp(first: float, second: float) -> bool:
    """Whether two stamps name one instant as an index entry does (to the nanosecond)."""
    return _stamp_ns(first) == _stamp_ns(second)


def parse_index_name(name: str) -> Optional[tuple[float, str]]:
    """(stamp, rollout id) of an entry's name (or its last part), or None when it is not one."""
    stamp, dash, rollout_id = name.rpartition("/")[2].partition("-")
    if not dash or not stamp.isdigit() or not is_valid_rollout_id(rollout_id):
        return None
    return int(stamp) / _NS, rollout_id


def add_to_index(capture_dir: str, kind: str, stamp: float, rollout_id: str, durable: bool = True) -> None:
    """The entry in a capture directory's index (an empty file; there already: nothing to do);
    ``durable``: its directory entry fsynced before this returns (an end's entry is)."""
    path = os.path.join(capture_dir, *index_name(kind, stamp, rollout_id).split("/"))
    bucket = os.path.dirname(path)
    new_bucket = not os.path.isdir(bucket)
    if new_bucket:
        os.makedirs(bucket, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644))
    if durable:
        fsync_directory(bucket)
        if new_bucket:
            fsync_directory(os.path.dirname(bucket))
            fsync_directory(capture_dir)


def add_to_store_index(store: ObjectStore, kind: str, stamp: float, rollout_id: str) -> None:
    """The entry in a capture store's index (an empty object, durable when this returns)."""
    store.put(index_name(kind, stamp, rollout_id), b"")


def index_entries_after(where: object, kind: str, stamp: float) -> list[tuple[float, str]]:
    """The entries of the index ``kind`` stamped at or after ``stamp``, oldest first: (stamp, rollout
    id). ``where``: a capture directory, or an `ObjectStore`. What it reads grows with the entries
    after ``stamp`` (and, in a directory, the number of minutes the index spans), not with the run."""
    point = index_point(kind, stamp)
    if isinstance(where, ObjectStore):
        names = where.names_after(kind, point)
    else:
        rest = point[len(kind) + 1:].split("/")
        names = walk_names_after(os.path.join(str(where), kind), rest)
    found = []
    for name in names:
        entry = parse_index_name(name)
        if entry is not None:
            found.append(entry)
    return found


__all__ = ["END_INDEX", "INDEX_LAG_SECONDS", "START_INDEX", "add_to_index", "add_to_store_index", "index_entries_after",
           "index_name", "index_point", "parse_index_name", "same_stamp"]
