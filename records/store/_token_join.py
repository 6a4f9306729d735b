"""One rollout's training-token entries from several sidecars' spools, joined (docs/tokens.md, docs/files.md).

On a shared volume every sidecar that serves a rollout reads the rollout's one token file, so a
call re-pinned to another sidecar is resolved to the call it continues, whichever sidecar made
that one. With writer segments each sidecar keeps its own files: the second sidecar's lineage
does not know the first's calls, and writes the continuing call ``unresolved`` (``no_match``),
which masks the rollout. Joining the spools' entries, `join_entries` applies the request-time
rule (`records.contract.RolloutLineage.resolve`'s: the request's model-authored turns match the candidate's
request and output, and the request begins with the context the candidate was made with; one
candidate, identical retries counted once, never a guess) to each such call, against every
spool's entries written before the call's request began (its line's ``started_at``), as a shared
volume would have shown them: the lineage itself (`RolloutLineage`), reading them from memory. A
call so linked gets its parent (its prompt stays whole: no delta to rebuild) and
``linked_across_spools: true``; every other entry keeps its bytes.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import orjson

from ..contract import RolloutLineage, request_items
from ..contract.reading import RESOLVED, UNRESOLVED

#: A choice's entry of a call with n > 1 is ``<model_call_id>-<choice>``.
_CHOICE_SUFFIX = re.compile(r"-[0-9]+$")


def join_entries(parts: list[bytes], capture_lines: bytes) -> bytes:
    """Each spool's ``.tokens.jsonl`` (``parts``, in spool order), one after the other, with the
    calls a spool could not resolve for want of another spool's calls linked to them.
    ``capture_lines``: the rollout's capture file (each call's request and ``started_at``)."""
    lines = [line for part in parts for line in part.split(b"\n") if line]
    entries: list[Optional[dict[str, Any]]] = []
    for line in lines:
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            entry = None
        entries.append(entry if isinstance(entry, dict) and isinstance(entry.get("model_call_id"), str) else None)
    waiting = [i for i, entry in enumerate(entries) if entry is not None
               and entry.get("parent_resolution") == UNRESOLVED and entry.get("parent_resolution_reason") == "no_match"]
    if waiting:
        requests = _requests(capture_lines)
        for i in waiting:
            entry = entries[i]
            assert entry is not None
            call = requests.get(entry["model_call_id"]) or requests.get(_CHOICE_SUFFIX.sub("", entry["model_call_id"]))
            if call is None:
                continue
            parent = _parent(*call, entry, entries)
            if parent is not None:
                entry.update(parent_call_id=parent, parent_resolution=RESOLVED, parent_resolution_reason="",
                             linked_across_spools=True)
                lines[i] = orjson.dumps(entry, option=orjson.OPT_SORT_KEYS)
    return b"".join(line + b"\n" for line in lines)


def _requests(capture_lines: bytes) -> dict[str, tuple[float, dict[str, Any]]]:
    """Each call's ``started_at`` and request, by call id."""
    found = {}
    for raw in capture_lines.split(b"\n"):
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(line, dict) and isinstance(line.get("model_call_id"), str) and isinstance(line.get("request"), dict) \
                and isinstance(line.get("started_at"), (int, float)):
            found[line["model_call_id"]] = (float(line["started_at"]), line["request"])
    return found


class _Written:
    """The entries a shared volume's token file would have held when a request began, as the
    lineage reads them (`records.contract._lineage.EntrySource`)."""

    def __init__(self, entries: list[tuple[int, dict[str, Any]]]) -> None:
        self._entries = entries
        self._by_offset = dict(entries)

    def entries(self, rollout_id: str, offset: int = 0) -> tuple[list[tuple[int, dict[str, Any]]], int]:
        return ([], offset) if offset else (self._entries, len(self._entries))

    def entry_at(self, rollout_id: str, offset: int) -> dict[str, Any]:
        return self._by_offset[offset]


def _parent(started_at: float, request: dict[str, Any], child: dict[str, Any],
            entries: list[Optional[dict[str, Any]]]) -> Optional[str]:
    """The call the request continues, by the lineage's own rule (`RolloutLineage.resolve`), among
    the entries written before the request began."""
    try:
        messages = request_items(request)
    except Exception:
        return None
    written = [(offset, entry) for offset, entry in enumerate(entries) if entry is not None and entry is not child
               and isinstance(entry.get("created_at"), (int, float)) and entry["created_at"] <= started_at]
    lineage = RolloutLineage(_Written(written), str(child.get("rollout_id") or ""))
    lineage.refresh()
    verdict = lineage.resolve(messages)
    return verdict.parent_call_id if verdict.resolved else None


__all__ = ["join_entries"]
