"""Which earlier call of its rollout a request continues, decided before the request is sent
(docs/tokens.md; Gym 0.7.0's ``RolloutLineage`` semantics, our code).

A request's `assistant_fingerprint` looks up the committed calls whose request plus output had
that fingerprint; each candidate must have been made with the context this request begins with
(`conversation_digest` of its first ``continuation_context_len`` items). No model-authored turn:
a root. One candidate: resolved. Several with the same sequence (identical retries): the first by
call id. None, or several that differ: unresolved (``no_match`` / ``ambiguous``), never a guess.

A token-in request (vLLM's ``/inference/v1/generate``: the prompt's ids, no turns) has no turns to
go by: `resolve_tokens` finds the longest earlier sequence its prompt begins with, exactly
(`token_digest`); none: a root, as the framework that rendered the prompt started anew.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

from ._fingerprints import FINGERPRINT_VERSION, assistant_fingerprint, conversation_digest
from ._token_entries import RESOLVED, ROOT, UNRESOLVED, entry_sequence, output_items, request_items, token_digest


class EntrySource(Protocol):
    """Where a rollout's entries are read from: `records.contract.TokenFiles`, or entries held in memory
    (the store's view joining several spools' entries: `records.store._token_join`)."""

    def entries(self, rollout_id: str, offset: int = 0) -> tuple[list[tuple[int, dict[str, Any]]], int]: ...

    def entry_at(self, rollout_id: str, offset: int) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LineageVerdict:
    """The decision for one request: ``status`` (root / resolved / unresolved), the parent's call
    id and whole sequence when resolved, and why when unresolved."""

    status: str
    parent_call_id: Optional[str] = None
    parent_sequence: Optional[list[int]] = None
    reason: str = ""
    #: The parent ended ``finish_reason: "abort"``: this call may resume it (issue 32).
    parent_aborted: bool = False

    @property
    def resolved(self) -> bool:
        return self.status == RESOLVED


@dataclass(frozen=True)
class _Node:
    call_id: str
    offset: int
    cum_len: int
    digest: str
    context_len: int
    context_digest: str
    parent_call_id: Optional[str]
    delta: bool
    aborted: bool = False
    #: The sequence's last token, or None when the entry stores none of its own (a cheap first
    #: test before a prompt's prefix is digested: `RolloutLineage.resolve_tokens`).
    last_token: Optional[int] = None


@dataclass
class RolloutLineage:
    """The calls of one rollout, indexed by continuation fingerprint as their entries are read
    (`refresh` reads only what was appended since); token arrays stay in the file."""

    files: EntrySource
    rollout_id: str
    offset: int = 0
    by_fingerprint: dict[str, list[str]] = field(default_factory=dict)
    nodes: dict[str, _Node] = field(default_factory=dict)
    #: Calls by the length, then the last token, of their whole sequence, for `resolve_tokens`.
    by_sequence_end: dict[int, dict[Optional[int], list[str]]] = field(default_factory=dict)

    def refresh(self) -> None:
        entries, self.offset = self.files.entries(self.rollout_id, self.offset)
        for offset, entry in entries:
            self.add(offset, entry)

    def add(self, offset: int, entry: dict[str, Any]) -> None:
        call_id = entry["model_call_id"]
        if call_id in self.nodes:
            return
        node = self.nodes[call_id] = _Node(
            call_id, offset, entry.get("cum_len") or 0, entry.get("digest") or "",
            entry.get("continuation_context_len") or 0, entry.get("continuation_context_digest") or "",
            entry.get("parent_call_id"), bool(entry.get("prompt_is_delta")), entry.get("finish_reason") == "abort",
            _last_token(entry))
        if node.digest and node.cum_len:
            self.by_sequence_end.setdefault(node.cum_len, {}).setdefault(node.last_token, []).append(call_id)
        fingerprint = entry.get("continuation_fingerprint") or ""
        if fingerprint and entry.get("fingerprint_version") in (None, FINGERPRINT_VERSION):
            self.by_fingerprint.setdefault(fingerprint, []).append(call_id)

    def resolve(self, messages: list[dict[str, Any]]) -> LineageVerdict:
        """The verdict for a request with these turns (`records.contract.request_items`)."""
        fingerprint = assistant_fingerprint(messages)
        if not fingerprint:
            return LineageVerdict(ROOT)
        candidates = [self.nodes[call_id] for call_id in dict.fromkeys(self.by_fingerprint.get(fingerprint, ()))
                      if self._continues(self.nodes[call_id], messages)]
        if len(candidates) > 1 and len({(node.digest, node.cum_len) for node in candidates}) == 1 and candidates[0].digest:
            candidates = [min(candidates, key=lambda node: node.call_id)]  # Identical retries are one call.
        if len(candidates) != 1:
            return LineageVerdict(UNRESOLVED, reason="no_match" if not candidates else "ambiguous")
        parent = candidates[0]
        sequence = self.sequence(parent.call_id)
        if sequence is None or token_digest(sequence) != parent.digest:
            return LineageVerdict(UNRESOLVED, reason="parent_unverified")
        return LineageVerdict(RESOLVED, parent.call_id, sequence, parent_aborted=parent.aborted)

    def resolve_tokens(self, prompt: list[int]) -> LineageVerdict:
        """The verdict for a token-in request with these prompt ids: the call whose whole sequence
        is the longest the prompt begins with (identical retries: the first by call id), or a root."""
        for length in sorted((length for length in self.by_sequence_end if length <= len(prompt)), reverse=True):
            by_last = self.by_sequence_end[length]
            calls = [*by_last.get(prompt[length - 1], ()), *by_last.get(None, ())]
            if not calls:
                continue
            digest = token_digest(prompt[:length])
            matching = [call_id for call_id in calls if self.nodes[call_id].digest == digest]
            if matching:
                parent = self.nodes[min(matching)]
                return LineageVerdict(RESOLVED, parent.call_id, prompt[:length], parent_aborted=parent.aborted)
        return LineageVerdict(ROOT)

    def sequence(self, call_id: str) -> Optional[list[int]]:
        """A call's whole sequence, rebuilt through its delta ancestors; None when one is missing."""
        chain = []
        node = self.nodes.get(call_id)
        while node is not None:
            chain.append(node)
            if not node.delta:
                break
            node = self.nodes.get(node.parent_call_id or "")
        else:
            return None
        sequence: Optional[list[int]] = None
        for node in reversed(chain):
            sequence = entry_sequence(self.files.entry_at(self.rollout_id, node.offset), sequence)
        return sequence

    @staticmethod
    def _continues(node: _Node, messages: list[dict[str, Any]]) -> bool:
        """The request begins with the context the candidate was made with (fail closed without one)."""
        return bool(node.context_digest) and len(messages) >= node.context_len and \
            conversation_digest(messages[:node.context_len]) == node.context_digest


def _last_token(entry: dict[str, Any]) -> Optional[int]:
    for key in ("generation_token_ids", "prompt_token_ids"):
        ids = entry.get(key)
        if isinstance(ids, list) and ids and type(ids[-1]) is int:
            return ids[-1]
        if ids:
            return None
    return None


#: What `LineLineage.place` says of a call: no model-authored turn; the earlier output it continues
#: (``(call_index, choice)``); or unknown (no match, several, or a request that is not JSON).
LINE_ROOT = "root"


class LineLineage:
    """The request-time rule applied afterwards, to a rollout's capture lines in append order: each
    call's request against the earlier calls' requests and outputs (one per choice). What
    `TokenRecord.extends` and ``drift_at`` are measured against (docs/tokens.md: drift only where a
    call claims to continue another)."""

    def __init__(self) -> None:
        self._by_fingerprint: dict[str, list[tuple[tuple[int, int], int, str]]] = {}

    def place(self, line: dict[str, Any], call_index: int) -> Any:
        """`LINE_ROOT`; the ``(call_index, choice)`` of the earlier outputs this request sends back
        (several when identical outputs were sent again: retries); or None when it matches none
        or cannot be read. Then the call is indexed."""
        request, response = line.get("request"), line.get("response")
        if not isinstance(request, dict) or not (isinstance(request.get("messages"), list)
                                                 or isinstance(request.get("input"), list)):
            return None  # No turns to go by (completions' prompt): whatever the ids say.
        try:
            items = request_items(request)
            fingerprint = assistant_fingerprint(items)
            verdict: Any = LINE_ROOT if not fingerprint else self._parent(fingerprint, items)
            self._index(call_index, items, response)
        except (ValueError, TypeError):
            return None
        return verdict

    def _parent(self, fingerprint: str, items: list[dict[str, Any]]) -> Optional[list[tuple[int, int]]]:
        candidates = [key for key, length, digest in self._by_fingerprint.get(fingerprint, ())
                      if len(items) >= length and conversation_digest(items[:length]) == digest]
        return candidates or None

    def _index(self, call_index: int, items: list[dict[str, Any]], response: Any) -> None:
        if not isinstance(response, dict):
            return
        choices = response.get("choices")
        count = len(choices) if isinstance(choices, list) and len(choices) > 1 else 1
        digest = conversation_digest(items)
        for choice in range(count):
            produced = output_items(response, choice if count > 1 else None)
            fingerprint = assistant_fingerprint([*items, *produced])
            if fingerprint:
                self._by_fingerprint.setdefault(fingerprint, []).append(((call_index, choice), len(items), digest))
