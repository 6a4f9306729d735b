"""A rollout's token records read back (docs/reading.md): `iter_token_records`, `read_token_records`,
the follower `mcc tail` uses, the token file's arrays and multi-turn drift. What one line reads as
(`TokenRecord`, `token_records_of_line`) is the contract's."""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional, Union

from ..contract.reading import LINE_ROOT, LineLineage
from ..store import directory_of
from ..store import CaptureStore, capture_store, gc_paused
from ..contract import TokenRecord, token_records_of_line
from ..contract.reading import names_token_entries
from ._trajectories import _common_prefix, build_trajectories


def iter_token_records(store: Union[CaptureStore, str, "os.PathLike[str]"], rollout_id: str,
                       token_dir: Optional[str] = None) -> Iterator[TokenRecord]:
    """`TokenRecord`\\ s of a rollout, one line at a time (only one call's arrays alive at once).

    A line the token capture mode wrote names its entries in the rollout's token file
    (``token_entries``): the arrays come from there (source ``token_file``), full prompts rebuilt
    from the stored suffixes and checked against each entry's digest. ``token_dir``: where the
    token files are, when not beside the capture files (``--token-dir``).

    Tolerant, as `read_model_call_records`: a torn or malformed line is skipped.
    """
    store = capture_store(store, "iter_token_records")
    if token_dir is not None:
        token_dir = directory_of(token_dir, "iter_token_records (token_dir)")
    follower = TokenRecordFollower(token_dir or store.capture_dir, rollout_id)
    for call_index, line in store.iter_available(rollout_id):
        if line is not None:
            yield from follower.records_of(call_index, line)


class TokenRecordFollower:
    """A rollout's token records line by line as its lines come (`iter_token_records`, and
    `mcc tail` as a file grows): lineage and the token file's arrays carried from line to line, so
    each line costs its own size, never the rollout's so far."""

    def __init__(self, token_dir: str, rollout_id: str) -> None:
        self.token_dir, self.rollout_id = token_dir, rollout_id
        self.drift = DriftTracker()
        self.arrays: Optional[TokenFileArrays] = None

    def records_of(self, call_index: int, line: dict[str, Any]) -> list[TokenRecord]:
        """The line's records (one per choice), in file order: call it for every line, in order."""
        records = token_records_of_line(line, self.rollout_id, call_index)
        if names_token_entries(line):
            if self.arrays is None:
                self.arrays = TokenFileArrays(self.token_dir, self.rollout_id)
            records = self.arrays.fill_line(records, line)
        claimed = self.drift.claims(line, call_index)
        return [self.drift.place(record, claimed) for record in records]


class TokenFileArrays:
    """A rollout's arrays from its token file, each call's whole sequence rebuilt through its
    parents (entries are written parent first) and checked against its digest."""

    def __init__(self, token_dir: str, rollout_id: str) -> None:
        from ..contract import TokenFiles

        self._files, self._rollout_id = TokenFiles(token_dir), rollout_id
        self._entries: dict[str, tuple[dict[str, Any], Optional[list[int]], Optional[str]]] = {}
        #: Every entry read, in file order (the builder's input), its build once made, and the
        #: ``call_index`` of each entry's line (an entry's call id: ``(call_index, choice)``).
        self._read: list[dict[str, Any]] = []
        self._build: Any = None
        self._call_of: dict[str, int] = {}
        self._sequences: dict[str, list[int]] = {}
        self._offset = 0
        self._problem: Optional[str] = None
        self._read_more()

    def _read_more(self) -> None:
        """Take in the entries written since the last read (a file still growing: `mcc tail`)."""
        from ..contract.reading import entry_sequence, token_digest

        try:
            entries, self._offset = self._files.entries(self._rollout_id, self._offset)
        except (OSError, ValueError) as exc:
            self._problem = f"the token file cannot be read: {exc}"
            return
        self._problem = None
        sequences = self._sequences
        if entries:
            self._build = None  # The builder's verdicts are over every entry: made again when asked.
        for _, entry in entries:
            self._read.append(entry)
            call_id = entry["model_call_id"]
            try:
                sequence = entry_sequence(entry, sequences.get(entry.get("parent_call_id") or ""))
            except ValueError:
                self._entries[call_id] = (entry, None, "its delta prompt's parent is not in the token file")
                continue
            if entry.get("digest") and token_digest(sequence) != entry["digest"]:
                self._entries[call_id] = (entry, None, "its rebuilt sequence does not match its digest")
                continue
            sequences[call_id] = sequence
            self._entries[call_id] = (entry, sequence[:len(sequence) - len(entry["generation_token_ids"])], None)

    def fill_line(self, records: list[TokenRecord], line: dict[str, Any]) -> list[TokenRecord]:
        """The records of ``line`` (`token_records_of_line`) with the arrays its entries hold."""
        named = line.get("token_entries")
        return [self.fill(record, named) for record in records] if isinstance(named, list) and named else records

    def fill(self, record: TokenRecord, named: list[Any]) -> TokenRecord:
        """``record`` with the arrays of the entry its line names for its choice, and the
        builder's verdict on it (`link_of`)."""
        call_id = named[record.choice_index] if record.choice_index < len(named) else None
        found = self._entries.get(call_id) if isinstance(call_id, str) else None
        if found is None and isinstance(call_id, str) and self._problem is None:
            self._read_more()  # Written after the last read (the entries precede their line).
            found = self._entries.get(call_id)
        if isinstance(call_id, str):
            self._call_of.setdefault(call_id, record.call_index)
            record = self.link_of(record, call_id)
        if not record.missing:
            return record  # The line has them (the agent asked for them itself).
        if found is None:
            return record.model_copy(update={"problem": self._problem or f"no entry {call_id} in the token file"})
        entry, prompt, problem = found
        if problem is not None:
            return record.model_copy(update={"problem": problem})
        return record.model_copy(update={
            "prompt_token_ids": prompt, "generation_token_ids": entry["generation_token_ids"],
            "generation_log_probs": entry["generation_log_probs"], "source": "token_file", "missing": (),
            "problem": None, "routed_experts": entry.get("routed_experts")})


    def link_of(self, record: TokenRecord, call_id: str) -> TokenRecord:
        """``record`` with the trajectory builder's verdict on the call ``call_id`` (the one
        verdict: `records.build_trajectories`' `records.CallLink`): ``extends`` the call index of
        the parent it is attached to, ``drift_at`` / ``drift_from`` where it departs from the
        parent it claims."""
        if self._build is None:
            self._build = build_trajectories(self._rollout_id, self._read)
        link = self._build.links.get(call_id)
        if link is None:
            return record
        found = self._entries.get(call_id)
        claimed = found[0].get("parent_call_id") if found is not None else None
        return record.model_copy(update={
            "link": link.status, "link_reason": link.reason,
            "extends": self._call_of.get(link.parent_call_id or "") if link.status == "extends" else None,
            "drift_at": link.drift_at,
            "drift_from": self._call_of.get(claimed or "") if link.drift_at is not None else None})


class DriftTracker:
    """Places each call's prompt against the prompt + generation ids of the call it continues.

    With the line (`LineLineage`'s verdict): a root is never drift; a call whose request sends
    back an earlier call's output extends that call, or drifts from it at the first token that
    differs. A request that matches no earlier call (or an unreadable one) falls back to the
    rollout's latest sequence it begins with, else the closest one. Comparisons are list slices
    (C speed); sequences are kept per call and choice.
    """

    def __init__(self) -> None:
        self._earlier: list[tuple[int, list[int]]] = []
        self._by_key: dict[tuple[int, int], list[int]] = {}
        self._lineage = LineLineage()

    def claims(self, line: dict[str, Any], call_index: int) -> Any:
        """What the line's request claims to continue (`LineLineage.place`); once per line."""
        return self._lineage.place(line, call_index)

    def place(self, record: TokenRecord, claimed: Any = None) -> TokenRecord:
        """The record placed by the lines' lineage, unless it carries the builder's verdict
        (``link``: a token capture mode call), which stands; its sequence is kept either way."""
        prompt = record.prompt_token_ids
        extends = drift_at = drift_from = None
        if prompt and claimed != LINE_ROOT and record.link is None:
            parents = [(key[0], self._by_key[key]) for key in claimed if key in self._by_key] if claimed else []
            claimed = bool(parents)
            if not parents:  # No claim to go by: the rollout's earlier sequences.
                parents = [(call_index, sequence) for call_index, sequence in self._earlier
                           if call_index != record.call_index]  # Another choice of this call is no earlier turn.
            # The latest parent it begins with wins, so look from the latest back and stop there:
            # a rollout without drift costs one comparison a call. Only a prompt that extends
            # none is measured against every candidate, for where it departs.
            for call_index, sequence in reversed(parents):
                if len(sequence) <= len(prompt) and prompt[:len(sequence)] == sequence:
                    extends = call_index
                    break
            else:
                measured = [(_common_prefix(prompt, sequence), call_index) for call_index, sequence in parents]
                best, drift_from = max(measured, default=(0, None))
                drift_at = best if (best or claimed) and drift_from is not None else None
                drift_from = drift_from if drift_at is not None else None
            if extends is not None or drift_at is not None:
                record = record.model_copy(update={"extends": extends, "drift_at": drift_at, "drift_from": drift_from})
        if prompt and record.generation_token_ids:
            sequence = prompt + record.generation_token_ids
            self._earlier.append((record.call_index, sequence))
            self._by_key[(record.call_index, record.choice_index)] = sequence
        return record


def read_token_records(store: Union[CaptureStore, str, "os.PathLike[str]"], rollout_id: str,
                       token_dir: Optional[str] = None) -> list[TokenRecord]:
    """Every `TokenRecord` of a rollout, in append order, then choice order."""
    with gc_paused():  # Millions of small ints and floats: see `gc_paused`.
        return list(iter_token_records(store, rollout_id, token_dir))
