"""One rollout's training-token entries from several sidecars' spools, joined (DESIGN §12, §14).

On a shared volume every sidecar that serves a rollout reads the rollout's one token file, so a
call re-pinned to another sidecar is resolved to the call it continues, whichever sidecar made
that one. With writer segments each sidecar keeps its own files: the second sidecar's lineage
does not know the first's calls, and writes the continuing call ``unresolved`` (``no_match``),
which masks the rollout. Joining the spools' entries, `join_entries` applies the request-time
rule (`records.RolloutLineage.resolve`'s: the request's model-authored turns match the candidate's
request and output, and the request begins with the context the candidate was made with; one
candidate, identical retries counted once, never a guess) to each such call, against every
spool's entries written before the call's request began (its line's ``started_at``), as a shared
volume would have shown them. A call so linked gets its parent (its prompt stays whole: no delta to
rebuild) and ``linked_across_spools: true``; every other entry keeps its bytes.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import orjson

from ._fingerprints import FINGERPRINT_VERSION, assistant_fingerprint, conversation_digest
from ._token_entries import RESOLVED, UNRESOLVED, request_items, token_digest

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
        by_id = {entry["model_call_id"]: entry for entry in entries if entry is not None}
        for i in waiting:
            entry = entries[i]
            assert entry is not None
            call = requests.get(entry["model_call_id"]) or requests.get(_CHOICE_SUFFIX.sub("", entry["model_call_id"]))
            if call is None:
                continue
            started_at, request = call
            parent = _parent(request, started_at, entry, entries, by_id)
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


def _parent(request: dict[str, Any], started_at: float, child: dict[str, Any], entries: list[Optional[dict[str, Any]]],
            by_id: dict[str, dict[str, Any]]) -> Optional[str]:
    """The one call the request continues among the entries written before it began, verified."""
    try:
        messages = request_items(request)
    except Exception:
        return None
    fingerprint = assistant_fingerprint(messages)
    if not fingerprint:
        return None
    candidates = [entry for entry in entries if entry is not None and entry is not child
                  and entry.get("continuation_fingerprint") == fingerprint
                  and entry.get("fingerprint_version") in (None, FINGERPRINT_VERSION)
                  and isinstance(entry.get("created_at"), (int, float)) and entry["created_at"] <= started_at
                  and _continues(entry, messages)]
    if len(candidates) > 1 and len({(e.get("digest"), e.get("cum_len")) for e in candidates}) == 1 and candidates[0].get("digest"):
        candidates = [min(candidates, key=lambda e: e["model_call_id"])]  # Identical retries are one call.
    if len(candidates) != 1:
        return None
    parent = candidates[0]
    sequence = _sequence(parent, by_id)
    if sequence is None or token_digest(sequence) != parent.get("digest"):
        return None
    return parent["model_call_id"]


def _continues(entry: dict[str, Any], messages: list[dict[str, Any]]) -> bool:
    context_len, context_digest = entry.get("continuation_context_len") or 0, entry.get("continuation_context_digest")
    return bool(context_digest) and len(messages) >= context_len and \
        conversation_digest(messages[:context_len]) == context_digest


def _sequence(entry: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> Optional[list[int]]:
    """The entry's whole sequence, through its delta ancestors; None when one is missing."""
    chain = [entry]
    while chain[-1].get("prompt_is_delta"):
        parent = by_id.get(chain[-1].get("parent_call_id") or "")
        if parent is None or len(chain) > len(by_id):
            return None
        chain.append(parent)
    sequence: list[int] = []
    try:  # Each entry's prompt (after its parent's sequence, when a delta), then its generation.
        for node in reversed(chain):
            prompt = [*sequence, *node["prompt_token_ids"]] if node.get("prompt_is_delta") else list(node["prompt_token_ids"])
            sequence = [*prompt, *node["generation_token_ids"]]
    except (KeyError, TypeError):
        return None
    return sequence


__all__ = ["join_entries"]
