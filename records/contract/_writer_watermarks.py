"""The writers' watermarks of a capture store, as the live hand-off's consumer reads them
(docs/reading.md, "Consuming from a capture store"; the writer's side: each sidecar's uploader).

Each writer (a sidecar's spool) puts ``writers/<spool_id>.json``: ``watermark`` (when its last
listing of the store's ends began), ``holding`` (the ended rollouts it still has lines or token
files of), ``seen`` (the ends it first saw in the last `SEEN_SECONDS`), ``stopped`` (it drained
and stopped), ``at`` (when it put this). `rollout_readiness` is the one rule over them.
"""

from __future__ import annotations

from typing import Any, Optional

import orjson

WRITER_OBJECTS = "writers"
#: How long an end stays in a writer's ``seen``; past that, its watermark vouches for it.
SEEN_SECONDS = 30.0


def writer_object_name(spool_id: str) -> str:
    return f"{WRITER_OBJECTS}/{spool_id}.json"


def read_watermarks(store: Any) -> list[dict[str, Any]]:
    """Every writer's watermark object in a store (an `ObjectStore`); unreadable ones left out."""
    found = []
    for name in store.names(WRITER_OBJECTS):
        data: Optional[bytes] = store.get_if_present(name)
        try:
            record = orjson.loads(data) if data else None
        except orjson.JSONDecodeError:
            continue
        if isinstance(record, dict) and isinstance(record.get("watermark"), (int, float)):
            found.append(record)
    return found


def rollout_readiness(watermarks: list[dict[str, Any]], rollout_id: str, ended_at: float, now: float,
                      writer_bound: float) -> str:
    """``ready`` (every writer has shipped all it held of the rollout), ``wait``, or ``incomplete``:
    a writer that went silent may hold lines of it (it had not seen its end, or still held it),
    and ``writer_bound`` seconds passed since it last spoke without it coming back. A writer
    silent since longer than ``writer_bound`` before the end is not waited for."""
    verdict = "ready"
    for writer in watermarks:
        holding, seen = writer.get("holding") or (), writer.get("seen") or ()
        if rollout_id not in holding and (writer.get("stopped") or rollout_id in seen
                                          or writer["watermark"] >= ended_at + SEEN_SECONDS):
            continue  # It has seen the end and holds nothing of the rollout.
        spoke = float(writer.get("at") or writer["watermark"])
        if now < spoke + writer_bound:
            return "wait"  # Running (it ships within a round or two), or silent for less than the bound.
        if rollout_id in holding or ended_at < spoke + writer_bound:
            verdict = "incomplete"
    return verdict


__all__ = ["SEEN_SECONDS", "WRITER_OBJECTS", "read_watermarks", "rollout_readiness", "writer_object_name"]
