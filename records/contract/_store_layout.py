"""Where a capture store keeps what (docs/files.md): the object names the sidecar's uploader writes
and every reader reads, and the one order a rollout's lines merge in. Writers and readers share
this module, so the layout has one place to change.

Per writer: sealed segments (``segments/<writer_id>/<sha256>.jsonl``: lines of
``<rollout_id>\\t<capture line>``) and manifests written after them
(``manifests/<writer_id>/<sequence>.json``), each rollout's lines' ``completed_at`` in append order,
so a reader can place every line of a segment from the manifests alone.
"""

from __future__ import annotations

import heapq
from typing import Any, Iterator

import orjson

MANIFESTS = "manifests"
SEGMENT_OBJECTS = "segments"
#: ``incomplete/<rollout_id>``: a line of the rollout was lost (the spool's ``.capture.incomplete``).
INCOMPLETE_OBJECTS = "incomplete"
#: The training-token files (docs/tokens.md): bundles of rollouts' files, each whole as its spool held
#: it (``tokens/<spool_id>/<sha256>.json``), and their manifests, written after them
#: (``token-manifests/<spool_id>/<time_ns>-<sha256 prefix>.json``); a rollout's latest wins.
TOKEN_OBJECTS = "tokens"
TOKEN_MANIFESTS = "token-manifests"
#: A rollout's training-token files, by suffix (`records.contract._token_files`), in the order they merge.
TOKEN_FILE_SUFFIXES = (".tokens.jsonl", ".tokens.intents", ".tokens.incomplete", ".tokens.late.jsonl",
                       ".tokens.state.json")


def manifest_name(writer_id: str, sequence: int) -> str:
    return f"{MANIFESTS}/{writer_id}/{sequence:010d}.json"


def incomplete_name(rollout_id: str) -> str:
    return f"{INCOMPLETE_OBJECTS}/{rollout_id}"


def token_bundle_name(spool_id: str, sha256: str) -> str:
    return f"{TOKEN_OBJECTS}/{spool_id}/{sha256}.json"


def token_manifest_name(spool_id: str, time_ns: int, sha256: str) -> str:
    return f"{TOKEN_MANIFESTS}/{spool_id}/{time_ns:020d}-{sha256[:16]}.json"


def segment_name(writer_id: str, sha256: str) -> str:
    return f"{SEGMENT_OBJECTS}/{writer_id}/{sha256}.jsonl"


def whole_segment_lines(data: bytes) -> Iterator[tuple[str, bytes, dict[str, Any]]]:
    """``(rollout_id, line, parsed line)`` for each line of a segment an append wrote whole, in
    append order: one rule for the uploader's manifest and every reader. Skipped: the torn last
    piece (a crash mid-append: never acknowledged), a blank line or a piece that is not one JSON
    object (an append that failed part-way, its rollout marked incomplete)."""
    for raw in data.split(b"\n")[:-1]:  # The last piece: b"", or torn.
        rollout, tab, line = raw.partition(b"\t")
        if not tab or not line:
            continue
        try:
            parsed = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(parsed, dict):
            yield rollout.decode(), line, parsed


def segment_order(data: bytes) -> dict[str, list[Any]]:
    """The manifest's ``completed_at``: each rollout's whole lines' ``completed_at``, in append order."""
    order: dict[str, list[Any]] = {}
    for rollout_id, _, parsed in whole_segment_lines(data):
        order.setdefault(rollout_id, []).append(parsed.get("completed_at"))
    return order


def merge_order(streams: list[list[Any]]) -> list[tuple[int, int]]:
    """The stated order of one rollout's lines from several writers (docs/files.md), from their
    ``completed_at`` alone: ``streams`` one list per writer, sorted by writer id, each in its append
    order; returns ``(stream, position)`` in merged order. Each writer's order is kept; across writers
    a line sorts by ``completed_at`` (one without sorts with the one before it), then writer id."""
    if len(streams) == 1:
        return [(0, position) for position in range(len(streams[0]))]

    def keyed(stream: int, values: list[Any]) -> Iterator[tuple[float, int, int]]:
        last = float("-inf")
        for position, completed in enumerate(values):
            if isinstance(completed, (int, float)):
                last = max(last, completed)
            yield last, stream, position

    return [(stream, position) for _, stream, position in heapq.merge(*(keyed(i, v) for i, v in enumerate(streams)))]


def merge_writers(streams: list[tuple[str, list[bytes]]]) -> list[bytes]:
    """One rollout's lines from several writers (``(writer id, lines)``, sorted by writer id) in the
    stated order (`merge_order`)."""
    if len(streams) == 1:
        return streams[0][1]
    values = []
    for _, lines in streams:
        completed = []
        for line in lines:
            try:
                parsed = orjson.loads(line)
            except orjson.JSONDecodeError:
                parsed = None
            completed.append(parsed.get("completed_at") if isinstance(parsed, dict) else None)
        values.append(completed)
    return [streams[stream][1][position] for stream, position in merge_order(values)]
