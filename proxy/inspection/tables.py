"""What `mcc ls`, `mcc show`, `mcc stats` and `mcc tail` compute from a capture directory.

Pure functions over `records`: no aiohttp, no printing. A call is summarised into a flat
`CallRow`; a rollout into a `RolloutRow`; a whole directory into `DirectoryStats`.
"""

from __future__ import annotations

import fnmatch
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Iterator, Optional

import orjson

from records.store import (
    read_model_call_records,
    CallRow, call_row, finish_reason_of, gc_paused, invalid_arguments, response_shape, tool_calls_of, usage_counts,
)
from records import CaptureStore
from records.training import DriftTracker, TokenFileArrays
from records.contract import token_records_of_line
from records.contract.reading import has_token_arrays, names_token_entries

from .conversation import reply_text


def iter_call_rows(store: CaptureStore, rollout_id: str, output_text: bool = False) -> Iterator[CallRow]:
    """The rollout's rows; with ``output_text``, each row's ``output_text`` is its reply's answer."""
    with gc_paused():
        result = store.read_available(rollout_id)
        rows = [call_row(rollout_id, index, line) for index, line in zip(result.call_indexes, result.lines)]
        if output_text:
            for row, line in zip(rows, result.lines):
                row.output_text = reply_text(line)
    yield from rows


def select_rollouts(store: CaptureStore, pattern: Optional[str] = None) -> list[str]:
    ids = store.rollout_ids()
    return [rid for rid in ids if fnmatch.fnmatchcase(rid, pattern)] if pattern else ids


@dataclass
class RolloutRow:
    """One rollout for `mcc ls`."""

    rollout_id: str
    calls: int = 0
    #: The calls that are the policy's turns: not side calls, not calls refused after the rollout's end.
    turns: int = 0
    #: Sums over the calls that reported them; None (shown ``-``) when none did, never a made-up 0.
    tokens_in: Optional[int] = None
    tokens_out: Optional[int] = None
    cached_tokens: Optional[int] = None
    errors: int = 0
    error_categories: dict[str, int] = field(default_factory=dict)
    first_call_at: Optional[float] = None
    last_call_at: Optional[float] = None
    incomplete: bool = False
    unreadable_lines: int = 0
    #: Latency of the slowest call (ms), for sorting by latency.
    max_latency_ms: Optional[float] = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _add(total: Optional[int], value: Optional[int]) -> Optional[int]:
    return total if value is None else (total or 0) + value


def rollout_row(store: CaptureStore, rollout_id: str) -> RolloutRow:
    row = RolloutRow(rollout_id, incomplete=store.is_incomplete(rollout_id))
    result = store.read_available(rollout_id)
    row.unreadable_lines = result.malformed
    categories: Counter[str] = Counter()
    uncounted: dict[int, tuple[bool, bool]] = {}  # call index -> (in missing, out missing)
    for index, line in zip(result.call_indexes, result.lines):
        call = call_row(rollout_id, index, line)
        row.calls += 1
        side = line.get("side_call")
        row.turns += not (isinstance(side, dict) and side.get("reason")) and line.get("error_category") != "rollout_ended"
        if call.tokens_in is None or call.tokens_out is None:
            uncounted[index] = (call.tokens_in is None, call.tokens_out is None)
        row.tokens_in = _add(row.tokens_in, call.tokens_in)
        row.tokens_out = _add(row.tokens_out, call.tokens_out)
        row.cached_tokens = _add(row.cached_tokens, call.cached_tokens)
        if call.latency_ms is not None:
            row.max_latency_ms = max(row.max_latency_ms or 0.0, call.latency_ms)
        if call.error_category:
            categories[call.error_category] += 1
        if call.started_at is not None:
            row.first_call_at = min(row.first_call_at or call.started_at, call.started_at)
            row.last_call_at = max(row.last_call_at or call.started_at, call.started_at)
    row.errors = sum(categories.values())
    row.error_categories = dict(categories)
    if uncounted:  # A stream that reported no usage: counted as `mcc show` counts it (the token mode's arrays).
        for record in read_model_call_records(store, rollout_id):
            missing_in, missing_out = uncounted.get(record.call_index, (False, False))
            if record.token_counts == "counted":
                row.tokens_in = _add(row.tokens_in, record.tokens_in) if missing_in else row.tokens_in
                row.tokens_out = _add(row.tokens_out, record.tokens_out) if missing_out else row.tokens_out
    return row


@dataclass
class DirectoryStats:
    """Everything `mcc stats` reports about a capture directory."""

    rollouts: int = 0
    calls: int = 0
    #: Sums over the calls that reported them; None when no call did (never a made-up 0).
    tokens_in: Optional[int] = 0
    tokens_out: Optional[int] = 0
    cached_tokens: Optional[int] = 0
    tokens_reasoning: Optional[int] = 0
    latency_ms: dict[str, Optional[float]] = field(default_factory=dict)
    ttft_ms: dict[str, Optional[float]] = field(default_factory=dict)
    error_categories: dict[str, int] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    #: Responses calls by ``status`` (completed, incomplete, failed): not finish reasons.
    response_statuses: dict[str, int] = field(default_factory=dict)
    #: Calls whose reply reported usage, and calls that reported cache counts (the ratios' denominators).
    calls_with_usage: int = 0
    calls_with_cache_counts: int = 0
    #: Share of the calls that reported cache counts which hit the prefix cache.
    cache_hit_ratio: Optional[float] = None
    #: Cached prompt tokens / prompt tokens, over calls that reported both.
    cached_token_ratio: Optional[float] = None
    tool_calls: int = 0
    tool_calls_with_invalid_arguments: int = 0
    turns_per_rollout: dict[str, Optional[float]] = field(default_factory=dict)
    unreadable_lines: int = 0
    incomplete_rollouts: int = 0
    #: Training arrays (issue 20): generations (a call's choices) that carry token ids, those a
    #: trainer may use, why the others may not, and multi-turn drift (`TokenRecord.extends`).
    generations_with_token_ids: int = 0
    usable_generations: int = 0
    unusable_reasons: dict[str, int] = field(default_factory=dict)
    prompts_extending_an_earlier_call: int = 0
    prompts_drifting: int = 0
    #: The token capture mode's calls by the trajectory builder's verdict on them
    #: (`records.CallLink`: ``root``, ``extends``, ``unlinked``, ``left_out``).
    calls_by_link: dict[str, int] = field(default_factory=dict)
    #: Issue 32: prompts sent on their parent's exact ids (proved / sent but not proved), calls
    #: resuming an aborted one, and generations per weight version (a generation counts once per
    #: version that sampled it) and those that spanned an update.
    prompts_supplied: int = 0
    prompts_supplied_unproved: int = 0
    resumed_calls: int = 0
    generations_by_weight_version: dict[str, int] = field(default_factory=dict)
    generations_spanning_an_update: int = 0
    #: Calls by the engine fingerprint that served them (`ModelCallRecord.system_fingerprint`), and
    #: the rollouts whose calls more than one fingerprint served (an engine changed mid-rollout).
    calls_by_engine_fingerprint: dict[str, int] = field(default_factory=dict)
    rollouts_with_several_engines: list[str] = field(default_factory=list)
    #: Multimodal prompt tokens by modality (vLLM's ``prompt_tokens_details.multimodal_tokens``
    #: mapping; a bare count is ``unnamed``), and the engine's per-request metrics (``metrics``,
    #: vLLM's ``--enable-per-request-metrics``): the calls that had them and each numeric one's sum.
    multimodal_tokens_by_modality: dict[str, int] = field(default_factory=dict)
    calls_with_engine_metrics: int = 0
    engine_metric_sums: dict[str, float] = field(default_factory=dict)
    #: Calls that are not turns (issue 71): side calls by reason (another model, a harness's title
    #: or quota call), and calls refused because their rollout had ended (``rollout_ended``).
    side_calls: dict[str, int] = field(default_factory=dict)
    calls_after_end: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


PERCENTILES = (50, 90, 99)
#: JSON numbers for latencies (``type(True)`` is bool, so bools are not among them).
_NUMBERS = (int, float)


def directory_stats(store: CaptureStore, rollout_ids: Iterable[str], progress: Any = None) -> DirectoryStats:
    """Scan every line of these rollouts once; ``progress.update(1)`` after each rollout."""
    totals = _StatsAccumulator()
    add_line = totals.add_line
    with gc_paused():
        for rollout_id in rollout_ids:
            lines = unreadable = 0
            totals.drift = DriftTracker()
            totals.token_arrays = _LazyTokenArrays(store.capture_dir, rollout_id)
            for call_index, line in store.iter_available(rollout_id):  # Each line is dropped once counted.
                if line is None:
                    unreadable += 1
                else:
                    add_line(line, call_index)
                    lines += 1
            totals.add_rollout(lines, unreadable, store.is_incomplete(rollout_id), rollout_id)
            if progress is not None:
                progress.update(1)
    return totals.finish()


class _StatsAccumulator:
    """Running totals of `directory_stats`, read straight from each line (no `CallRow`, no
    reasoning text or operations): `mcc stats` scans whole run directories, so each line costs
    one parse and one pass over the parts of its response that the totals use (issue 8: at least
    100,000 lines/s on one core)."""

    def __init__(self) -> None:
        self.stats = DirectoryStats()
        self.latencies: list[float] = []
        self.ttfts: list[float] = []
        self.turns: list[float] = []
        self.errors: dict[str, int] = {}  # Plain dicts: a Counter's `+=` is a slower path per line.
        self.finishes: dict[str, int] = {}
        self.statuses: dict[str, int] = {}
        self.cache_reported = self.cache_hits = self.prompt_tokens_with_cache = self.reasoning_reported = 0
        self.unusable: dict[str, int] = {}
        #: The current rollout's earlier prompt + generation ids.
        self.drift = DriftTracker()
        #: The current rollout's token file, read when a line leaves its arrays there.
        self.token_arrays: "_LazyTokenArrays | None" = None
        #: The engine fingerprints of the current rollout's calls.
        self.fingerprints: set[str] = set()
        #: The current rollout's calls that are not turns (side calls, calls after its end).
        self.not_turns = 0

    def add_line(self, line: dict[str, Any], call_index: int = 0) -> None:
        # One flat function: at 100,000 lines/s every method call and attribute store shows.
        get, stats, response = line.get, self.stats, line.get("response")
        stats.calls += 1
        finish = None
        if type(response) is dict:
            fingerprint = response.get("system_fingerprint")
            if type(fingerprint) is str and fingerprint:
                self.fingerprints.add(fingerprint)
                by = stats.calls_by_engine_fingerprint
                by[fingerprint] = by.get(fingerprint, 0) + 1
            usage = response.get("usage")
            if type(usage) is dict and usage:
                stats.calls_with_usage += 1
                details = usage.get("prompt_tokens_details")
                if type(details) is dict and "multimodal_tokens" in details:
                    self._add_multimodal(details["multimodal_tokens"])
                tokens_in, tokens_out, tokens_reasoning, cached = usage_counts(usage)
                # The totals are ints until `finish` (None there: nothing reported).
                if tokens_in is not None:
                    stats.tokens_in += tokens_in  # type: ignore[operator]  # an int until finish
                if tokens_out is not None:
                    stats.tokens_out += tokens_out  # type: ignore[operator]  # an int until finish
                if tokens_reasoning is not None:
                    stats.tokens_reasoning += tokens_reasoning  # type: ignore[operator]  # an int until finish
                    self.reasoning_reported += 1
                if cached is not None:
                    self.cache_reported += 1
                    self.cache_hits += cached > 0
                    stats.cached_tokens += cached  # type: ignore[operator]  # an int until finish
                    self.prompt_tokens_with_cache += tokens_in or 0
            metrics = response.get("metrics")
            if type(metrics) is dict and metrics:
                self._add_engine_metrics(metrics)
            shape = response_shape(response)
            finish = finish_reason_of(response, shape)
            status = response.get("status")
            if type(status) is str:
                statuses = self.statuses
                statuses[status] = statuses.get(status, 0) + 1
            if has_token_arrays(response) or names_token_entries(line):
                self._add_generations(line, call_index)
            tool_calls = tool_calls_of(response, shape)
            if tool_calls:
                stats.tool_calls += len(tool_calls)
                stats.tool_calls_with_invalid_arguments += invalid_arguments(tool_calls)
        latency: Any = get("latency_ms")  # Any: checked inline below
        ttft: Any = get("latency_ttft_ms")
        category = get("error_category")
        if type(latency) in _NUMBERS:
            self.latencies.append(latency)
        if type(ttft) in _NUMBERS:
            self.ttfts.append(ttft)
        if type(category) is str:
            errors = self.errors
            errors[category] = errors.get(category, 0) + 1
            if category == "rollout_ended":
                stats.calls_after_end += 1
                self.not_turns += 1
        side = get("side_call")
        if type(side) is dict and type(side.get("reason")) is str:
            stats.side_calls[side["reason"]] = stats.side_calls.get(side["reason"], 0) + 1
            self.not_turns += 1
        if finish:
            finishes = self.finishes
            finishes[finish] = finishes.get(finish, 0) + 1

    def _add_multimodal(self, found: Any) -> None:
        by = self.stats.multimodal_tokens_by_modality
        if type(found) is int and found > 0:
            by["unnamed"] = by.get("unnamed", 0) + found
        elif type(found) is dict:
            for modality, count in found.items():
                if type(count) is int and count > 0:
                    by[modality] = by.get(modality, 0) + count

    def _add_engine_metrics(self, metrics: dict[str, Any]) -> None:
        stats = self.stats
        stats.calls_with_engine_metrics += 1
        sums = stats.engine_metric_sums
        for name, value in metrics.items():
            if type(value) in (int, float):
                sums[name] = sums.get(name, 0.0) + value

    def _add_generations(self, line: dict[str, Any], call_index: int) -> None:
        stats = self.stats
        records = token_records_of_line(line, "", call_index)
        if names_token_entries(line) and self.token_arrays is not None:
            records = self.token_arrays.get().fill_line(records, line)
        claimed = self.drift.claims(line, call_index)
        for record in records:
            record = self.drift.place(record, claimed)
            stats.generations_with_token_ids += record.generation_token_ids is not None
            reason = record.unusable_reason
            if reason is None:
                stats.usable_generations += 1
            else:
                kind = reason.split(":")[0]
                self.unusable[kind] = self.unusable.get(kind, 0) + 1
            stats.prompts_extending_an_earlier_call += record.extends is not None
            stats.prompts_drifting += record.drift_at is not None
            if record.link is not None:
                stats.calls_by_link[record.link] = stats.calls_by_link.get(record.link, 0) + 1
            stats.prompts_supplied += record.prefix_supplied is True
            stats.prompts_supplied_unproved += record.prefix_supplied is False
            stats.resumed_calls += record.resumes is not None
            stats.generations_spanning_an_update += record.spans_weight_update
            for label in record.weight_version_labels:
                stats.generations_by_weight_version[label] = stats.generations_by_weight_version.get(label, 0) + 1

    def add_rollout(self, lines: int, unreadable: int, incomplete: bool, rollout_id: str = "") -> None:
        if len(self.fingerprints) > 1:
            self.stats.rollouts_with_several_engines.append(rollout_id)
        self.fingerprints = set()
        self.stats.rollouts += 1
        self.stats.unreadable_lines += unreadable
        self.stats.incomplete_rollouts += incomplete
        self.turns.append(float(lines - self.not_turns))  # Side calls and calls after the end are no turns.
        self.not_turns = 0

    def finish(self) -> DirectoryStats:
        stats = self.stats
        stats.latency_ms = percentiles(self.latencies)
        stats.ttft_ms = percentiles(self.ttfts)
        stats.error_categories = dict(Counter(self.errors).most_common())
        stats.finish_reasons = dict(Counter(self.finishes).most_common())
        stats.response_statuses = dict(Counter(self.statuses).most_common())
        stats.unusable_reasons = dict(Counter(self.unusable).most_common())
        stats.calls_with_cache_counts = self.cache_reported
        if not stats.calls_with_usage:
            stats.tokens_in = stats.tokens_out = None
        if not self.cache_reported:
            stats.cached_tokens = None
        if not self.reasoning_reported:
            stats.tokens_reasoning = None
        stats.cache_hit_ratio = self.cache_hits / self.cache_reported if self.cache_reported else None
        stats.cached_token_ratio = (stats.cached_tokens or 0) / self.prompt_tokens_with_cache if self.prompt_tokens_with_cache else None
        stats.turns_per_rollout = {"min": min(self.turns, default=None), **percentiles(self.turns), "max": max(self.turns, default=None)}
        return stats


def percentiles(values: list[float]) -> dict[str, Optional[float]]:
    """Nearest-rank p50 / p90 / p99."""
    ordered = sorted(values)
    result: dict[str, Optional[float]] = {}
    for p in PERCENTILES:
        result[f"p{p}"] = ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1] if ordered else None
    return result


def read_call(store: CaptureStore, rollout_id: str, call_index: int) -> Optional[dict[str, Any]]:
    """The line at ``call_index``: None when that line is unreadable; KeyError when there is none."""
    for index, line in store.iter_available(rollout_id):
        if index == call_index:
            return line
    raise KeyError(f"rollout {rollout_id} has no call {call_index}")


def pretty_json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


class _LazyTokenArrays:
    """A rollout's `TokenFileArrays`, read the first time a line needs them."""

    def __init__(self, directory: str, rollout_id: str) -> None:
        self._directory, self._rollout_id = directory, rollout_id
        self._arrays: "TokenFileArrays | None" = None

    def get(self) -> "TokenFileArrays":
        if self._arrays is None:
            self._arrays = TokenFileArrays(self._directory, self._rollout_id)
        return self._arrays
