"""Trainable rows: a rollout's calls chained into token sequences (docs/tokens.md, issue 31).

`trajectories(directory, rollout_id)` reads the rollout's training-token file and builds what NeMo
Gym 0.7.0's ``prefix_merging`` builds from the same entries (our code for its contract):

1. entries deduplicated by call id (two different payloads for one id: a conflict, the call left out);
2. delta prompts rebuilt through their parents and checked against each entry's digest;
3. calls without generated tokens left out (no training signal; they would pose as parents);
4. each call attached to its recorded parent when the parent's digest matches this prompt's first
   ``cum_len`` ids -- a root stays a root, an unresolved call starts a fragment (never guessed);
   a missing parent is recovered by the longest earlier sequence the prompt begins with, if unique;
5. retries (siblings with one prompt): the one a later call extends is kept, else the first by
   call id, and an unkept final retry is unresolved;
6. every root-to-leaf path without a quarantined call is a chain; the main one is the chain whose
   root finished first (``created_at``, then call id).

The rollout is masked (never trained on) when Gym would mask it without a verified terminal: a
lost call (an intent without an entry, or an incomplete mark), an unresolved parent or retry, more
than one root or chain, or nothing generated. Each chain carries ``token_ids``, ``loss_mask`` (1 on
sampled tokens), ``logprobs`` (None on prompt tokens) and ``calls`` (each call's generated span).
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..store import directory_of
from ..store import CaptureStore
from ..contract.reading import RESOLVED, ROOT, UNRESOLVED, token_digest
from ..contract import TokenFiles, read_in_flight
from ..contract.reading import calls_in_flight
from ..contract import resolved_spans
from ..contract.reading import token_versions


class CallSpan(BaseModel):
    """Where one call's generated tokens stand in a chain: ``[start, end)``."""

    model_config = ConfigDict(frozen=True)

    model_call_id: str
    start: int
    end: int
    #: The call's routed experts (``--capture-routed-experts``): its token entry's reference to the
    #: stored object, read by `records.read_routed_experts`; None when none were stored.
    routed_experts: Optional[dict[str, Any]] = None


class Trajectory(BaseModel):
    """One chain of calls as one token sequence."""

    chain_id: str
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[Optional[float]]
    calls: list[CallSpan]
    #: Per token, the weight version that sampled it (None on prompt tokens and where no version
    #: is known); None when no call of the chain names one (issue 32).
    weight_versions: Optional[list[Optional[str]]] = None

    @property
    def weight_version_labels(self) -> list[str]:
        """The versions that sampled this chain's tokens, in order (a trainer's staleness filter)."""
        return [label for label in dict.fromkeys(self.weight_versions or ()) if label is not None]


class CallLink(BaseModel):
    """One call's place in its rollout's build: the one verdict every reader gives for the call
    (`records.TokenRecord` takes ``extends``, ``drift_at`` and ``link_reason`` from it, and the
    commands theirs from those)."""

    model_config = ConfigDict(frozen=True)

    model_call_id: str
    #: ``root`` (it continues no call), ``extends`` (its prompt begins with ``parent_call_id``'s
    #: prompt + generation), ``unlinked`` (it claims a parent it cannot be attached to: the rollout
    #: is masked), ``left_out`` (in no chain: no generated tokens, a retry not kept, a delta prompt
    #: that cannot be rebuilt).
    status: str
    #: The call it extends (``extends``), or the retry's parent (``left_out`` retries); else None.
    parent_call_id: Optional[str] = None
    #: Why it is not a plain root or extension (the build's ``parent_link_failures`` names, and
    #: ``no_generated_tokens`` / ``retry_not_kept``), else None.
    reason: Optional[str] = None
    #: Unlinked from a recorded parent whose prompt + generation its prompt does not begin with:
    #: the index of the first token that differs; else None.
    drift_at: Optional[int] = None


class TrajectoryBuild(BaseModel):
    """A rollout's chains (the main one first), whether it must be masked and why, and what the
    build left out (Gym's metric names)."""

    rollout_id: str
    chains: list[Trajectory] = Field(default_factory=list)
    masked: bool = True
    mask_reason: Optional[str] = None
    notes: dict[str, Any] = Field(default_factory=dict)
    #: Each call's verdict (`CallLink`), by ``model_call_id``.
    links: dict[str, CallLink] = Field(default_factory=dict)

    @property
    def main(self) -> Optional[Trajectory]:
        return self.chains[0] if self.chains else None


class _Node:
    __slots__ = ("entry", "prompt", "length", "_sequence", "parent", "children", "quarantined", "boundary", "note",
                 "drift_at")

    def __init__(self, entry: dict[str, Any], prompt: list[int]) -> None:
        self.entry = entry
        self.prompt = prompt
        self.length = len(prompt) + len(entry["generation_token_ids"])
        self._sequence: Optional[list[int]] = None
        self.parent: Optional[_Node] = None
        self.children: list[_Node] = []
        self.quarantined = False
        self.boundary = False
        #: Why `_link` attached it to no parent, or to a recovered one; where it drifts from its claimed one.
        self.note: Optional[str] = None
        self.drift_at: Optional[int] = None

    @property
    def sequence(self) -> list[int]:
        """Prompt + generation, built when first needed (most links never need it whole)."""
        if self._sequence is None:
            self._sequence = [*self.prompt, *self.entry["generation_token_ids"]]
        return self._sequence


def trajectories(directory: Union[str, "os.PathLike[str]", CaptureStore], rollout_id: str) -> TrajectoryBuild:
    """The rollout's chains from ``<directory>/<rollout_id>.tokens.jsonl`` (read, never frozen);
    ``directory``: a path or a `CaptureStore`."""
    files = TokenFiles(directory_of(directory, "trajectories"))
    entries = [entry for _, entry in files.entries(rollout_id)[0]]
    state = files.state(rollout_id, indexed=False)  # Its flags: the entries were just read.
    written = {entry["model_call_id"] for entry in entries}
    lost = [call_id for call_id in files.intents(rollout_id) if call_id not in written]
    build = build_trajectories(rollout_id, entries)
    if lost and calls_in_flight(read_in_flight(files.directory), rollout_id, time.time()):
        # Its calls are still under way on a live sidecar (docs/reading.md, "One write barrier"): not lost.
        build.masked = True
        build.notes["call_in_flight"] = True
        build.mask_reason = (f"call in flight: {len(lost)} call(s) dispatched and not finished yet "
                             f"({', '.join(lost[:3])}); read it again once they are")
        return build
    if not entries:
        build.mask_reason = "no training-token entries"
    elif state.get("incomplete") or lost:
        build.masked = True
        build.notes["capture_incomplete"] = True
        build.mask_reason = (f"{len(lost)} call(s) dispatched without an entry: {', '.join(lost[:3])}" if lost
                             else "an entry could not be written (the rollout is marked incomplete)")
    return build


def build_trajectories(rollout_id: str, entries: list[dict[str, Any]]) -> TrajectoryBuild:
    """`trajectories` from entries already read."""
    failures: dict[str, int] = {}
    unresolved_parents: list[str] = []
    unique = _deduplicated(entries, failures, unresolved_parents)
    conflicted = set(unresolved_parents)
    verified: set[str] = set()
    prompts = _full_prompts(unique, failures, unresolved_parents, verified)
    empty = [e["model_call_id"] for e in unique if e["model_call_id"] in prompts and not e["generation_token_ids"]]
    nodes = [_Node(e, prompts[e["model_call_id"]]) for e in unique
             if e["model_call_id"] in prompts and e["generation_token_ids"]]
    nodes.sort(key=lambda node: (len(node.prompt), node.entry["model_call_id"]))
    roots = _link(nodes, failures, unresolved_parents, verified)
    unresolved_retries = _settle_retries(nodes)
    chains = [_chain(path) for path in _leaf_paths(nodes)]
    chains.sort(key=lambda chain: (chain[1], chain[0].calls[0].model_call_id))
    trajectories_ = [chain for chain, _ in chains]
    for position, chain in enumerate(trajectories_):
        chain.chain_id = "main" if position == 0 else f"branch-{position - 1}"
    captured = sum(len(node.entry["generation_token_ids"]) for node in nodes)
    delivered = sum(span.end - span.start for span in trajectories_[0].calls) if trajectories_ else 0
    notes = {"n_calls": len(entries), "chains": len(trajectories_), "roots": len(roots),
             "quarantined_calls": sum(node.quarantined for node in nodes),
             "generated_tokens_captured": captured, "generated_tokens_delivered": delivered,
             "delivered_fraction": round(delivered / captured, 4) if captured else 0.0,
             "parent_link_failures": failures, "unresolved_parent_calls": unresolved_parents,
             "unresolved_retries": unresolved_retries, "empty_generation_calls": empty}
    reason = _mask_reason(notes, trajectories_)
    return TrajectoryBuild(rollout_id=rollout_id, chains=trajectories_, masked=reason is not None,
                           mask_reason=reason, notes=notes, links=_links(unique, prompts, nodes, conflicted))


def _links(unique: list[dict[str, Any]], prompts: dict[str, list[int]], nodes: list[_Node],
           conflicted: set[str]) -> dict[str, CallLink]:
    """Each call's `CallLink`, from what the build decided of it."""
    links: dict[str, CallLink] = {}
    for entry in unique:
        call_id = entry["model_call_id"]
        if call_id not in prompts:
            links[call_id] = CallLink.model_construct(model_call_id=call_id, status="left_out", parent_call_id=None,
                                                      reason="delta_chain_unreconstructable", drift_at=None)
        elif not entry["generation_token_ids"]:
            links[call_id] = CallLink.model_construct(model_call_id=call_id, status="left_out", parent_call_id=None,
                                                      reason="no_generated_tokens", drift_at=None)
    for node in nodes:
        call_id = node.entry["model_call_id"]
        parent = node.parent.entry["model_call_id"] if node.parent is not None else None
        status: str
        reason: Optional[str]
        if call_id in conflicted:
            status, reason = "unlinked", "duplicate_call_id_conflict"
        elif node.quarantined:
            status, reason = "left_out", "retry_not_kept"
        elif parent is not None:
            status, reason = "extends", node.note
        else:
            status, reason = ("root", None) if node.note is None else ("unlinked", node.note)
        links[call_id] = CallLink.model_construct(model_call_id=call_id, status=status, parent_call_id=parent,
                                                  reason=reason, drift_at=node.drift_at if status == "unlinked" else None)
    return links


def _deduplicated(entries: list[dict[str, Any]], failures: dict[str, int], unresolved: list[str]) -> list[dict[str, Any]]:
    kept: dict[str, dict[str, Any]] = {}
    for entry in entries:
        earlier = kept.get(entry["model_call_id"])
        if earlier is None:
            kept[entry["model_call_id"]] = entry
        elif (earlier["prompt_token_ids"], earlier["generation_token_ids"]) != (entry["prompt_token_ids"],
                                                                                entry["generation_token_ids"]):
            _fail(failures, "duplicate_call_id_conflict")
            unresolved.append(entry["model_call_id"])
    return list(kept.values())


def _full_prompts(entries: list[dict[str, Any]], failures: dict[str, int], unresolved: list[str],
                  verified: Optional[set[str]] = None) -> dict[str, list[int]]:
    """Each entry's whole prompt (deltas rebuilt through their parents and verified); an entry whose
    chain cannot be rebuilt exactly is left out. ``verified`` gets the calls whose whole sequence
    was checked against their digest here (each is hashed once)."""
    by_id = {entry["model_call_id"]: entry for entry in entries}
    sequences: dict[str, Optional[list[int]]] = {}

    def sequence_of(call_id: str, depth: int = 0) -> Optional[list[int]]:
        if call_id in sequences:
            return sequences[call_id]
        entry = by_id.get(call_id)
        sequences[call_id] = None  # A cycle resolves to None.
        if entry is None or depth > 10_000:
            return None
        prompt = entry["prompt_token_ids"]
        if entry.get("prompt_is_delta"):
            parent = sequence_of(entry.get("parent_call_id") or "", depth + 1)
            if parent is None:
                return None
            prompt = [*parent, *prompt]
        sequence = [*prompt, *entry["generation_token_ids"]]
        if entry.get("prompt_is_delta") and entry.get("digest"):
            if token_digest(sequence) != entry["digest"]:
                return None
            if verified is not None:
                verified.add(call_id)
        sequences[call_id] = sequence
        return sequence

    prompts = {}
    for entry in entries:
        call_id = entry["model_call_id"]
        if not entry.get("prompt_is_delta"):
            prompts[call_id] = entry["prompt_token_ids"]
            continue
        sequence = sequence_of(call_id)
        if sequence is None:
            _fail(failures, "delta_chain_unreconstructable")
            unresolved.append(call_id)
            continue
        prompts[call_id] = sequence[:len(sequence) - len(entry["generation_token_ids"])]
    return prompts


def _link(nodes: list[_Node], failures: dict[str, int], unresolved: list[str], verified: set[str]) -> list[_Node]:
    """Attach each call to its verified parent; the roots (and fragments after a boundary)."""
    by_id: dict[str, _Node] = {}
    present = {node.entry["model_call_id"] for node in nodes}
    recover = any(node.entry.get("parent_call_id") and node.entry["parent_call_id"] not in present for node in nodes)
    earlier: list[_Node] = []
    roots = []
    for node in nodes:
        parent, note = _parent_of(node, by_id, earlier if recover else None, verified)
        node.note = note
        if note == "parent_digest_mismatch" and node.entry.get("parent_call_id") in by_id:
            node.drift_at = _common_prefix(node.prompt, by_id[node.entry["parent_call_id"]].sequence)
        if note is not None:
            _fail(failures, note)
            if not note.endswith("_recovered"):
                node.boundary = True
                unresolved.append(node.entry["model_call_id"])
        if parent is not None:
            node.parent = parent
            parent.children.append(node)
        else:
            roots.append(node)
        by_id[node.entry["model_call_id"]] = node
        earlier.append(node)
    return roots


def _parent_of(node: _Node, by_id: dict[str, _Node], earlier: Optional[list[_Node]],
               verified: set[str]) -> tuple[Optional[_Node], Optional[str]]:
    entry, prompt = node.entry, node.prompt
    resolution = entry.get("parent_resolution")
    if resolution == ROOT:
        return None, None
    if resolution == UNRESOLVED:
        return None, "parent_unresolved"
    claimed = entry.get("parent_call_id")
    if resolution != RESOLVED and claimed is None:
        return None, "missing_resolution"
    if claimed is None:
        return None, "resolved_parent_missing_id"
    parent = by_id.get(claimed)
    if parent is None:
        found = _longest_prefix(prompt, earlier or [])
        return (found, "parent_call_id_missing_recovered") if found is not None else (None, "parent_call_id_missing")
    length = parent.entry.get("cum_len") or parent.length
    if node.entry.get("prompt_is_delta") and entry.get("parent_call_id") == claimed and length == parent.length:
        # Its prompt was rebuilt as the parent's sequence + its suffix: the prefix *is* the parent's
        # sequence, whose digest is checked once (here, or when it was itself rebuilt).
        if parent.entry["model_call_id"] not in verified:
            if parent.entry.get("digest") and token_digest(parent.sequence) != parent.entry["digest"]:
                return None, "parent_digest_mismatch"
            verified.add(parent.entry["model_call_id"])
        return parent, None
    if length <= len(prompt) and token_digest(prompt[:length]) == (parent.entry.get("digest") or token_digest(parent.sequence)):
        return parent, None
    return None, "parent_digest_mismatch"


def _common_prefix(left: list[int], right: list[int]) -> int:
    """The length of the longest common prefix, by bisection on slice equality (C-level compares)."""
    low, high = 0, min(len(left), len(right))
    while low < high:
        middle = (low + high + 1) // 2
        if left[:middle] == right[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _longest_prefix(prompt: list[int], earlier: list[_Node]) -> Optional[_Node]:
    """The earlier call whose sequence is the longest prefix of ``prompt``, when it is the only one."""
    best: list[_Node] = []
    for node in earlier:
        length = node.length
        if length <= len(prompt) and prompt[:length] == node.sequence:
            if not best or length > best[0].length:
                best = [node]
            elif length == best[0].length:
                best.append(node)
    return best[0] if len(best) == 1 else None


def _settle_retries(nodes: list[_Node]) -> list[str]:
    """Siblings with one prompt are retries: keep the one a later call extends (else the first by
    call id, and say the group is unresolved); quarantine the rest."""
    groups: dict[tuple[int, tuple[int, ...]], list[_Node]] = {}
    for node in nodes:
        groups.setdefault((id(node.parent), tuple(node.prompt)), []).append(node)
    unresolved = []
    for group in groups.values():
        if len(group) < 2:
            continue
        kept = [node for node in group if any(not child.quarantined for child in node.children)]
        if not kept:
            kept = [min(group, key=lambda node: node.entry["model_call_id"])]
            unresolved += [node.entry["model_call_id"] for node in group]
        for node in group:
            if node not in kept:
                node.quarantined = True
    return unresolved


def _leaf_paths(nodes: list[_Node]) -> list[list[_Node]]:
    paths = []
    for leaf in (node for node in nodes if not node.children):
        path: list[_Node] = []
        current: Optional[_Node] = leaf
        while current is not None:
            path.append(current)
            current = current.parent
        if not any(node.quarantined for node in path):
            paths.append(path[::-1])
    return paths


def _chain(path: list[_Node]) -> tuple[Trajectory, float]:
    """The chain's sequence: the root's prompt, then each call's new prompt ids (mask 0) and its
    generated ids (mask 1, with their logprobs); and when its root finished, to pick the main one."""
    tokens = list(path[0].prompt)
    mask = [0] * len(tokens)
    logprobs: list[Optional[float]] = [None] * len(tokens)
    calls = []
    versions: list[Optional[str]] = []
    versioned = any(node.entry.get("weight_versions") for node in path)
    for node in path:
        new_prompt = node.prompt[len(tokens):] if node is not path[0] else []
        tokens += new_prompt
        mask += [0] * len(new_prompt)
        logprobs += [None] * len(new_prompt)
        start = len(tokens)
        tokens += node.entry["generation_token_ids"]
        mask += [1] * len(node.entry["generation_token_ids"])
        logprobs += node.entry["generation_log_probs"]
        if versioned:
            versions += [None] * (start - len(versions))
            versions += token_versions(resolved_spans(node.entry.get("weight_versions"), len(tokens) - start),
                                       len(tokens) - start)
        calls.append(CallSpan.model_construct(model_call_id=node.entry["model_call_id"], start=start, end=len(tokens),
                                              routed_experts=node.entry.get("routed_experts")))
    root_finished = path[0].entry.get("created_at") or 0.0
    # Built here, from checked entries: constructed without validating every id again.
    return Trajectory.model_construct(chain_id="", token_ids=tokens, loss_mask=mask, logprobs=logprobs,
                                      calls=calls, weight_versions=versions if versioned else None), root_finished


def _mask_reason(notes: dict[str, Any], chains: list[Trajectory]) -> Optional[str]:
    """Gym's strict single-chain policy (no verified terminal)."""
    if not chains or not any(chains[0].loss_mask):
        return "no trainable generated tokens"
    if notes["unresolved_retries"]:
        return f"a retry whose kept generation is unknown: {', '.join(notes['unresolved_retries'][:3])}"
    if notes["unresolved_parent_calls"]:
        return f"calls without a verified parent: {', '.join(notes['unresolved_parent_calls'][:3])}"
    if notes["roots"] != 1 or notes["chains"] != 1:
        return f"{notes['roots']} roots and {notes['chains']} chains, not one"
    return None


def _fail(failures: dict[str, int], note: str) -> None:
    failures[note] = failures.get(note, 0) + 1
