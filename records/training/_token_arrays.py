"""Token rows with int64 / float64 arrays, as the Ray dataset's read tasks build them (issue 24).

The rows are `iter_token_records`' records (the same parse of every line, the same verdicts),
with the arrays as numpy arrays for Arrow. What differs is how a read task gets there, because
of what multi-turn rollouts are: each prompt repeats the rollout's earlier prompt + generation
and adds a little, so a rollout's prompt ids grow with the square of its turns and are most of
its bytes. The reader parses every one of them into a Python int, checks it, and compares it
with the earlier turn's. A read task does not:

- A line whose response carries the only ``"prompt_token_ids":[...]`` of the line (vLLM's chat
  and completions replies with ``return_token_ids``) is parsed with that array cut out
  (``null`` in its place: the key stays where it was); the array's bytes are kept.
- The prompt is then placed against the rollout's earlier sequences by their JSON bytes: it
  extends an earlier call exactly when it begins with that call's prompt + generation ids as
  JSON, up to a ``,`` or its ``]``. Only the ids after that prefix are parsed; the prefix's int64
  array is the earlier sequence's own.

That is the reader's verdict because the bytes are canonical JSON: the sequences a read task
keeps are orjson's own serialisation, and a cut array is taken only when it holds nothing but
digits and commas and parses as JSON (no sign, no leading zero, no space), so two arrays of ids
are equal exactly when their bytes are. Anything else -- a line with a second
``prompt_token_ids``, arrays elsewhere, spaces, a float, a torn tail -- is parsed whole, as the
reader parses it, and placed by the same rule on its serialisation. A prompt that extends no
earlier call is measured against every one on the int64 arrays (where it departs).

An id that does not fit int64 (JSON allows it; orjson reads ids up to 2**64 - 1) cannot be a
value of Arrow's ``list<int64>``: that array is null in the row and ``problem`` says so, so the
row is not usable -- where the reader, which keeps Python ints, would not object.

numpy comes with pyarrow (the ``ray`` extra): this module is imported only by a read task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import orjson

from ._token_rows import token_row
from ..contract.reading import LINE_ROOT, LineLineage
from ..contract import TokenRecord, token_records_of_line
from ._trajectories import _common_prefix

_PROMPT_KEY = b'"prompt_token_ids":'
#: What an array of ids may hold to be placed by its bytes (`bytes.translate` deletes these).
_DIGITS_AND_COMMAS = b"0123456789,"
_COMMA, _CLOSE = ord(","), ord("]")


def int64_array(ids: list[int]) -> Optional[np.ndarray]:
    """``ids`` (checked ints) as int64, or None when one does not fit. `np.fromiter` with a known
    count: about 1.7x as fast as `np.asarray` on a list of ints."""
    try:
        return np.fromiter(ids, dtype=np.int64, count=len(ids))
    except OverflowError:
        return None


@dataclass(frozen=True)
class _Sequence:
    """An earlier call's prompt + generation ids, as a later prompt may begin with them."""

    call_index: int
    choice_index: int
    #: Their canonical JSON without the closing ``]``: ``[1,2,3``.
    body: bytes
    #: As int64 (None: an id past int64).
    ids: Optional[np.ndarray]


@dataclass(frozen=True)
class _Prompt:
    """A record's prompt ids: canonical JSON, int64 (None past int64), and the earlier sequence
    it begins with (None when none)."""

    json: bytes
    ids: Optional[np.ndarray]
    extends: Optional[_Sequence]


class RolloutTokenRows:
    """The rows of one rollout's lines, in order (a read task makes one per capture file)."""

    def __init__(self, rollout_id: str) -> None:
        self.rollout_id = rollout_id
        self.earlier: list[_Sequence] = []
        self.by_key: dict[tuple[int, int], _Sequence] = {}
        self.lineage = LineLineage()

    def rows_of_line(self, line: bytes, call_index: int) -> Optional[list[dict[str, Any]]]:
        """The rows of one complete line (with its LF), or None when the reader finds it unreadable."""
        cut = _cut_prompt(line)
        if cut is not None:
            rest, span = cut
            parsed = _loads_dict(rest)
            response = parsed.get("response") if parsed is not None else None
            if (parsed is not None and type(response) is dict and "prompt_token_ids" in response
                    and response["prompt_token_ids"] is None
                    and type(response.get("choices")) is list and response["choices"]):
                prompt = self._prompt_of_json(span, call_index)
                if prompt is not None:
                    claimed = self.lineage.place(parsed, call_index)
                    return [self._row(_prompt_found(record), prompt, claimed)
                            for record in token_records_of_line(parsed, self.rollout_id, call_index)]
        parsed = _loads_dict(line)
        if parsed is None:
            return None
        rows = []
        claimed = self.lineage.place(parsed, call_index)
        for record in token_records_of_line(parsed, self.rollout_id, call_index):
            ids = record.prompt_token_ids
            prompt = None if ids is None else self._prompt_of_list(ids, call_index)
            rows.append(self._row(record, prompt, claimed))
        return rows

    def _prompt_of_json(self, span: bytes, call_index: int) -> Optional[_Prompt]:
        """The prompt of a cut array's bytes, or None when they are not canonical ids (the line is
        then read whole)."""
        extends = self._extended(span, call_index)
        start = 0 if extends is None else len(extends.body) + 1  # The new ids, after the prefix's ``,``.
        if extends is not None and span[start - 1] == _CLOSE:
            return _Prompt(span, extends.ids, extends)
        new = span[start:-1] if start else span[1:-1]
        if (start and not new) or new.translate(None, _DIGITS_AND_COMMAS):
            return None
        try:
            parsed = orjson.loads(b"[" + new + b"]")
        except orjson.JSONDecodeError:
            return None
        ids = int64_array(parsed)
        if extends is not None:
            ids = None if ids is None or extends.ids is None else np.concatenate((extends.ids, ids))
        return _Prompt(span, ids, extends)

    def _prompt_of_list(self, prompt: list[int], call_index: int) -> _Prompt:
        """The prompt of a parsed (and checked) list of ids."""
        json = orjson.dumps(prompt)
        extends = self._extended(json, call_index)
        if extends is None or extends.ids is None:
            return _Prompt(json, int64_array(prompt), extends)
        new = int64_array(prompt[len(extends.ids):])
        return _Prompt(json, None if new is None else np.concatenate((extends.ids, new)), extends)

    def _extended(self, prompt: bytes, call_index: int) -> Optional[_Sequence]:
        """The latest earlier call (another call than this one) whose prompt + generation ids
        this prompt begins with: `DriftTracker`'s rule, on canonical JSON."""
        for sequence in reversed(self.earlier):
            end = len(sequence.body)
            if (sequence.call_index != call_index and prompt.startswith(sequence.body)
                    and prompt[end] in (_COMMA, _CLOSE)):
                return sequence
        return None

    def _row(self, record: TokenRecord, prompt: Optional[_Prompt], claimed: Any) -> dict[str, Any]:
        generation = record.generation_token_ids
        generation_ids = None if generation is None else int64_array(generation)
        if prompt is not None and prompt.json != b"[]":  # An empty prompt is placed nowhere, as the reader's.
            extends, drift_at, drift_from = self._verdict(record.call_index, prompt, claimed)
            if extends is not None or drift_at is not None:
                record = record.model_copy(update={"extends": extends, "drift_at": drift_at, "drift_from": drift_from})
            if generation:
                ids = (None if prompt.ids is None or generation_ids is None
                       else np.concatenate((prompt.ids, generation_ids)))
                sequence = _Sequence(record.call_index, record.choice_index,
                                     prompt.json[:-1] + b"," + orjson.dumps(generation)[1:-1], ids)
                self.earlier.append(sequence)
                self.by_key[(record.call_index, record.choice_index)] = sequence
        return token_array_row(record, prompt is not None, None if prompt is None else prompt.ids, generation_ids)

    def _verdict(self, call_index: int, prompt: _Prompt, claimed: Any) -> tuple[Optional[int], Optional[int], Optional[int]]:
        """(extends, drift_at, drift_from): `DriftTracker.place`'s rule, on canonical JSON."""
        if claimed == LINE_ROOT:
            return None, None, None
        parents = [self.by_key[key] for key in claimed if key in self.by_key] if claimed else []
        if parents:
            for sequence in reversed(parents):
                end = len(sequence.body)
                if prompt.json.startswith(sequence.body) and prompt.json[end] in (_COMMA, _CLOSE):
                    return sequence.call_index, None, None
            best, drift_from = self._longest_common_prefix(prompt, parents)
            return None, best, drift_from
        if prompt.extends is not None:
            return prompt.extends.call_index, None, None
        best, drift_from = self._longest_common_prefix(
            prompt, [sequence for sequence in self.earlier if sequence.call_index != call_index])
        return (None, best, drift_from) if best else (None, None, None)

    @staticmethod
    def _longest_common_prefix(prompt: _Prompt, sequences: list[_Sequence]) -> tuple[int, Optional[int]]:
        """How far the prompt agrees with the closest of ``sequences`` (ids, not bytes), and its call."""
        best: tuple[int, Optional[int]] = (0, None)
        for sequence in sequences:
            if prompt.ids is not None and sequence.ids is not None:
                length = min(len(prompt.ids), len(sequence.ids))
                differ = prompt.ids[:length] != sequence.ids[:length]
                first = int(differ.argmax()) if length else 0
                agreed = first if length and differ[first] else length
            else:  # An id past int64: compare Python ints, as the reader does.
                agreed = _common_prefix(orjson.loads(prompt.json), orjson.loads(sequence.body + b"]"))
            best = max(best, (agreed, sequence.call_index))
        return best


def _cut_prompt(line: bytes) -> Optional[tuple[bytes, bytes]]:
    """``line`` with its one ``"prompt_token_ids":[...]`` array cut out (``null`` in its place),
    and the array's bytes; None when the line has not exactly one, or it is not flat.

    The key is found by its bytes: a ``"`` inside a JSON string is escaped, so
    ``{"prompt_token_ids":`` or ``,"prompt_token_ids":`` is a key wherever it appears. The array
    ends at its first ``]`` when it holds no other array (checked by its bytes later).
    """
    at = line.find(_PROMPT_KEY)
    if at <= 0 or line[at - 1] not in b"{," or line.find(_PROMPT_KEY, at + 1) != -1:
        return None
    start = at + len(_PROMPT_KEY)
    if line[start:start + 1] != b"[":
        return None
    end = line.find(b"]", start)
    if end == -1:
        return None
    return line[:start] + b"null" + line[end + 1:], line[start:end + 1]


def _loads_dict(line: bytes) -> Optional[dict[str, Any]]:
    try:
        parsed = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return parsed if type(parsed) is dict else None


def _prompt_found(record: TokenRecord) -> TokenRecord:
    """A record read with its prompt cut out, as the reader makes it with the prompt there: a
    list of ints adds no problem, so only ``missing`` changes."""
    return record.model_copy(update={"missing": tuple(name for name in record.missing if name != "prompt_token_ids")})


def token_array_row(record: TokenRecord, has_prompt: bool, prompt: Optional[np.ndarray],
                    generation: Optional[np.ndarray]) -> dict[str, Any]:
    """The row of ``kind="tokens"`` (`token_row`'s), with its arrays as numpy arrays."""
    lost = [name for name, present, array in (("prompt_token_ids", has_prompt, prompt),
                                              ("generation_token_ids", record.generation_token_ids is not None, generation))
            if present and array is None]
    if lost:
        said = [record.problem] if record.problem else []
        record = record.model_copy(update={
            "problem": "; ".join(said + [f"{name} has an id outside int64 (Arrow's list<int64> cannot hold it)"
                                         for name in lost])})
    row = token_row(record)
    row["prompt_token_ids"], row["generation_token_ids"] = prompt, generation
    log_probs = record.generation_log_probs
    row["generation_log_probs"] = None if log_probs is None else np.fromiter(log_probs, dtype=np.float64, count=len(log_probs))
    return row
