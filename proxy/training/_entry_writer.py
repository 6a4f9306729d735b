"""The sidecar's training-token files (docs/tokens.md): lineage before a call, its entry after.

Before a call in the token capture mode goes upstream, `TokenCapture.prepare` (on a worker thread:
it reads files) resolves which earlier call of the rollout the request continues, and notes the
call's intent durably. After the reply, `EntryWriter.commit` (where the call's line is built: in
the capture process, else on a writer thread; before the line, so both are on disk before the
agent sees the end) builds the entry from the captured arrays and appends it under Gym's store
protocol; what the sidecar keeps of that comes back as notes (`TokenCapture.take_notes`). A call
that produced no usable arrays (an error, a cut stream, a refusal) gets no entry: its intent stays
dangling, and a consumer masks the rollout, as Gym does. Nothing here ever changes a reply: a failure is logged, counted and marked incomplete.

n > 1: one entry per choice, ``<model_call_id>-<choice>``, siblings with one parent; a later
request resolves to the choice whose output it sent back. Token-in calls (``generate``) have no
turns: their parent is the call whose sequence their prompt begins with
(`RolloutLineage.resolve_tokens`). Messages: vLLM's Anthropic endpoint
returns no arrays, so Messages calls get no entries and no intents.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import orjson

from capture import REMOVE_MEMBER, AddedFieldCutter

from records.contract import (
    RolloutLineage, RoutedExperts, RoutedExpertsProblem, TokenFiles, TokenRecord, request_items, resolved_spans,
    token_records_of_line,
)
from records.contract.writing import LineageVerdict, RolloutClosed, output_items, token_entry, write_routed_experts

log = logging.getLogger("mcc.capture")
#: Dialects whose vLLM replies carry token arrays (``generate``: vLLM's token-in/token-out path,
#: whose arrays are explicit: the mode adds and cuts nothing there).
TOKEN_DIALECTS = frozenset({"chat", "completions", "responses", "generate"})
#: Rollouts whose lineage index stays in memory (each holds metadata only, no arrays).
_ROLLOUTS_KEPT = 4096


@dataclass
class TokenPlan:
    """What `prepare` decided for one call, for `commit` (only `intent_unflushed` changes)."""

    rollout_id: str
    entry_ids: tuple[str, ...]
    items: list[dict[str, Any]]
    verdict: LineageVerdict
    #: The earlier call this one repeats byte for byte (kept on the entry: Gym's entries allow extra keys).
    retry_of: Optional[str] = None
    #: The intents file, while the call's intent is written but not yet flushed (`prepare` leaves
    #: it so): made durable by the call's capture line's barrier, or before the reply's first byte
    #: when it goes to the agent before its line (`flush_intent_soon`).
    intent_unflushed: Optional[str] = None
    #: The request's own ``routed_experts_prompt_start``: the first token the reply's routed experts cover.
    experts_start: int = 0
    #: Routed experts were stored apart (``--capture-routed-experts``): the line names them, its
    #: reply's arrays replaced by their references.
    experts_stored: bool = False


class TokenCapture:
    """The training-token files of one directory, for the sidecar."""

    def __init__(self, directory: str, metrics: Any, routed_experts: bool = False) -> None:
        self.files = TokenFiles(directory)
        #: A call's line built on a writer thread of this process writes through these files too.
        with _FILES_LOCK:
            _FILES[directory] = self.files
        self._metrics = metrics
        #: --capture-routed-experts: each call's routed experts stored apart (docs/tokens.md).
        self.routed_experts = routed_experts
        #: A reply without routed experts under --capture-routed-experts was said (once).
        self._said_no_experts = False
        self._lineages: OrderedDict[str, tuple[RolloutLineage, threading.Lock]] = OrderedDict()
        #: Guards the index of lineages; each lineage has its own lock (`_lineage`), so calls of
        #: other rollouts resolve at once (each reads its own files).
        self._lock = threading.Lock()
        #: The problems a whole call's arrays were unusable for, said once each (`_unusable`).
        self._said_unusable: set[str] = set()

    def prepare(self, rollout_id: str, model_call_id: str, dialect: str, request: dict[str, Any],
                retry_of: Optional[str] = None) -> Optional[TokenPlan]:
        """The call's lineage verdict, its intent written, not yet flushed (`TokenPlan.intent_unflushed`);
        None when it gets no entry (Messages, a frozen rollout, a request lineage cannot read).
        Runs on a worker thread."""
        if dialect not in TOKEN_DIALECTS:
            return None
        prompt = request.get("token_ids") if dialect == "generate" else None
        if dialect == "generate" and not _token_ids(prompt):
            return None  # Not a prompt vLLM takes: refused upstream, no entry to write.
        try:
            items = request_items(request)
            choices = _choices(dialect, request)
            ids = (model_call_id,) if choices == 1 else tuple(f"{model_call_id}-{i}" for i in range(choices))
            lineage, lock = self._lineage(rollout_id)
            with lock:
                lineage.refresh()
                verdict = lineage.resolve(items) if prompt is None else lineage.resolve_tokens(prompt)
            intents = self.files.begin_call(rollout_id, list(ids), durable=False)
        except RolloutClosed as exc:
            self._fail("closed", rollout_id, model_call_id, f"{exc}: this call is not written to it")
            return None
        except Exception as exc:
            self._fail(type(exc).__name__, rollout_id, model_call_id, f"lineage could not be resolved: {exc}")
            return None
        return TokenPlan(rollout_id, ids, items, verdict, retry_of, intents, _experts_start(dialect, request))

    def flush_intent_soon(self, plan: TokenPlan) -> "asyncio.Future[None]":
        """Make the plan's intent durable, from the event loop: the future is done once it is on
        disk; a failure marks the call's entries incomplete (the rollout is then masked, as for a
        lost entry), never fails the call. No thread waits meanwhile: with one asleep in the
        barrier per call, the loop's executor would queue the next calls' lineage behind them (issue 76)."""
        loop = asyncio.get_running_loop()
        flushed: asyncio.Future[None] = loop.create_future()
        path = plan.intent_unflushed
        if path is None:
            flushed.set_result(None)
            return flushed

        def durable(failure: Optional[OSError]) -> None:  # On the barrier's thread.
            if failure is not None:
                self._failed(plan, failure)
            plan.intent_unflushed = None
            try:
                loop.call_soon_threadsafe(_settle, flushed)
            except RuntimeError:  # The loop closed meanwhile (shutdown): nobody waits.
                pass
        self.files.after_durable(path, durable)
        return flushed

    def take_notes(self, notes: Optional[list[tuple[str, tuple[Any, ...]]]]) -> None:
        """What writing a call's entries did that this sidecar keeps (`EntryWriter`'s notes, wherever
        it ran): its counters, its words to the log, the entries its lineage may take as written.
        On the event loop, before the call's line settles."""
        for name, args in notes or ():
            if name in _NOTES:
                getattr(self, name)(*args)

    def _count(self, metric: str, label: Optional[str], amount: float = 1) -> None:
        counter = getattr(self._metrics, metric)
        (counter.labels(label) if label is not None else counter).inc(amount)

    def _no_experts(self, rollout_id: str, call_id: str) -> None:
        if self._said_no_experts:  # Said once: every reply will lack them.
            return
        self._said_no_experts = True
        log.warning("--capture-routed-experts: the upstream's reply (call %s of rollout %s) carries no "
                    "routed_experts, so none are stored; start vLLM with --enable-return-routed-experts "
                    "(a MoE model), or drop --capture-routed-experts", call_id, rollout_id,
                    extra={"rollout_id": rollout_id, "kind": "routed_experts"})

    def _experts_not_stored(self, rollout_id: str, call_id: str, problem: str) -> None:
        self._count("token_entry_failures", "routed_experts")
        log.warning("training tokens of call %s of rollout %s: its routed experts are not stored (%s)",
                    call_id, rollout_id, problem, extra={"rollout_id": rollout_id, "kind": "routed_experts"})

    def _indexed(self, rollout_id: str, entry: dict[str, Any], start: int, end: Optional[int]) -> None:
        """The rollout's lineage takes the entry just written as it is, when it had read the file up
        to the entry's line (no other writer in between): the next call's `refresh` does not read
        it back (issue 34). On the event loop (`take_notes`): a lineage a worker thread holds (it
        reads the files) is left to read the entry itself, never waited for."""
        with self._lock:
            found = self._lineages.get(rollout_id)
        if found is None or end is None:
            return
        lineage, lock = found
        if not lock.acquire(blocking=False):
            return
        try:
            if lineage.offset == start:
                lineage.add(start, entry)
                lineage.offset = end
        finally:
            lock.release()

    def _failed(self, plan: TokenPlan, exc: BaseException) -> None:
        self._fail(*mark_incomplete(self.files, plan, exc))

    def _lineage(self, rollout_id: str) -> tuple[RolloutLineage, threading.Lock]:
        """The rollout's lineage and the lock its readers and writers hold."""
        with self._lock:
            found = self._lineages.get(rollout_id)
            if found is None:
                found = self._lineages[rollout_id] = (RolloutLineage(self.files, rollout_id), threading.Lock())
                while len(self._lineages) > _ROLLOUTS_KEPT:
                    self._lineages.popitem(last=False)
            else:
                self._lineages.move_to_end(rollout_id)
            return found

    def _unusable(self, rollout_id: str, entry_id: str, problem: str) -> None:
        """A whole call without a training entry: its arrays disagree (`TokenRecord.problem`)."""
        self._metrics.token_entry_failures.labels("arrays_unusable").inc()
        kind = re.sub(r"\d+", "N", problem)  # One problem, whatever its counts.
        with self._lock:
            if kind in self._said_unusable:
                return
            self._said_unusable.add(kind)
        log.warning("training tokens of call %s of rollout %s: no entry, its arrays cannot be trained on (%s); "
                    "the rollout is masked. Said once per kind, counted in "
                    "mcc_token_entry_failures_total{kind=\"arrays_unusable\"}", entry_id, rollout_id, problem,
                    extra={"rollout_id": rollout_id, "kind": "arrays_unusable"})

    def _fail(self, kind: str, rollout_id: str, model_call_id: str, message: str) -> None:
        self._metrics.token_entry_failures.labels(kind).inc()
        log.warning("training tokens of call %s of rollout %s: %s", model_call_id, rollout_id, message,
                    extra={"rollout_id": rollout_id, "kind": kind})


class EntryWriter:
    """A call's entries written (`commit`), where its line is built: in the capture process, or
    on a writer thread where there is none (`proxy.training._token_line`). What the sidecar keeps
    of it -- counters, words to the log, the lineage's index -- goes into ``notes``, for
    `TokenCapture.take_notes`: this runs outside the sidecar's interpreter, and nothing here
    ever changes a reply."""

    def __init__(self, files: TokenFiles, routed_experts: bool) -> None:
        self.files = files
        self.routed_experts = routed_experts
        self.notes: list[tuple[str, tuple[Any, ...]]] = []

    def commit(self, plan: TokenPlan, line: bytes, prefix: Optional[bool] = None,
               unsynced: Optional[list[str]] = None) -> Optional[dict[str, Any]]:
        """Write the call's entries from its capture line (arrays included). When every choice's
        entry is on disk, the line's fields parsed (the line may then leave the arrays to the token
        file); else None."""
        try:
            fields = orjson.loads(line)
            records = token_records_of_line(fields, plan.rollout_id, 0)
        except Exception as exc:
            self.failed(plan, exc)
            return None
        return fields if self.commit_records(plan, records, fields.get("response"), prefix, unsynced) else None

    def commit_records(self, plan: TokenPlan, records: list[TokenRecord], response: Any,
                       prefix: Optional[bool] = None, unsynced: Optional[list[str]] = None) -> bool:
        """Write an entry per choice from its records (arrays present); True when all are on disk
        (or written, with ``unsynced``: the files to make durable are added to it, see
        `TokenFiles.append_indexed`). ``prefix``: None when no prefix was supplied, else its proof
        (Gym's ``prefix_requested`` / ``prefix_supplied``)."""
        response = response if isinstance(response, dict) else {}
        written = 0
        try:
            for position, entry_id in enumerate(plan.entry_ids):
                record = next((r for r in records if r.choice_index == position), None)
                if record is None or not (record.usable or _resumable(record)):
                    # No entry: the intent stays, and the rollout is masked. A call the agent saw
                    # whole whose arrays cannot be trained on is said (once a kind) and counted,
                    # never silently missing; a cut or failed call says so on its line already.
                    if record is not None and record.problem is not None and record.error_category is None:
                        self.notes.append(("_unusable", (plan.rollout_id, entry_id, record.problem)))
                    continue
                entry = token_entry(
                    rollout_id=plan.rollout_id, model_call_id=entry_id, model=record.model or "",
                    prompt_token_ids=list(record.prompt_token_ids or []),
                    generation_token_ids=list(record.generation_token_ids or []),
                    generation_log_probs=list(record.generation_log_probs or []),
                    items=output_items(response, position if len(plan.entry_ids) > 1 else None),
                    response_id=response.get("id") if isinstance(response.get("id"), str) else None,
                    created_at=time.time(), request=plan.items, parent_call_id=plan.verdict.parent_call_id,
                    parent_resolution=plan.verdict.status, reason=plan.verdict.reason,
                    parent_sequence=plan.verdict.parent_sequence)
                if plan.retry_of is not None:
                    entry["retry_of"] = plan.retry_of
                if prefix is not None:
                    entry["prefix_requested"], entry["prefix_supplied"] = True, prefix
                if record.finish_reason == "abort":  # Kept for the call that resumes it (issue 32).
                    entry["finish_reason"] = "abort"
                if record.resumes is not None:
                    entry["resumes"] = record.resumes
                if self.routed_experts:
                    self._store_routed_experts(plan, response, position, entry)
                spans = resolved_spans(record.weight_versions, len(entry["generation_token_ids"]))
                if spans is not None:  # Extra keys: Gym's entries allow them (issue 32).
                    entry["weight_versions"], entry["weight_version_source"] = spans, record.weight_version_source
                outcome, start, end = self.files.append_indexed(entry, unsynced)
                self.notes.append(("_count", ("token_entries", outcome)))
                if start is not None:
                    self.notes.append(("_indexed", (plan.rollout_id, lineage_entry(entry), start, end)))
                written += 1
        except Exception as exc:
            self.failed(plan, exc)
            return False
        return written == len(plan.entry_ids)

    def _store_routed_experts(self, plan: TokenPlan, response: dict[str, Any], position: int,
                              entry: dict[str, Any]) -> None:
        """The choice's routed experts (vLLM: base64 ``.npy``, a row per token read from the
        request's ``routed_experts_prompt_start`` on, the last token none) stored as their own
        object, only the rows its parent's entry does not hold; the entry and the line's reply name
        it. Rows that do not fit the call's tokens are not stored: said, counted, the entry kept."""
        choices = response.get("choices")
        choice = choices[position] if isinstance(choices, list) and position < len(choices) else None
        encoded = choice.get("routed_experts") if isinstance(choice, dict) else None
        if not isinstance(encoded, str):
            if isinstance(choice, dict):
                self.notes.append(("_no_experts", (plan.rollout_id, entry["model_call_id"])))
            return
        sequence = entry["cum_len"]
        prompt_stored = len(entry["prompt_token_ids"])
        parent_end = (sequence - prompt_stored - len(entry["generation_token_ids"])) if entry["prompt_is_delta"] else 0
        try:
            reply_rows = RoutedExperts.from_base64(encoded, plan.experts_start)
            if reply_rows.start + reply_rows.rows != sequence - 1:
                raise RoutedExpertsProblem(f"{reply_rows.rows} rows from token {reply_rows.start} for a sequence of "
                                           f"{sequence} tokens (expected {sequence - 1 - reply_rows.start})")
            # The parent's entry holds the rows up to its last token, which only this call read.
            kept = reply_rows.from_row(max(0, parent_end - 1 - reply_rows.start))
            reference = write_routed_experts(self.files.directory, plan.rollout_id, kept)
        except (RoutedExpertsProblem, OSError) as exc:
            self.notes.append(("_experts_not_stored", (plan.rollout_id, entry["model_call_id"], str(exc))))
            return
        self.notes.append(("_count", ("routed_experts_bytes", None, len(kept.data))))
        entry["routed_experts"] = reference
        choice["routed_experts"] = reference  # type: ignore[index]  # a dict: its value was read above
        plan.experts_stored = True

    def failed(self, plan: TokenPlan, exc: BaseException) -> None:
        """The entries could not be written, or the barrier that was to make them durable failed:
        they may be lost (marked incomplete: the rollout is masked)."""
        self.notes.append(("_fail", mark_incomplete(self.files, plan, exc)))


def _sampling(dialect: str, request: dict[str, Any]) -> dict[str, Any]:
    """Where a request's sampling fields are: the request itself, or generate's ``sampling_params``."""
    source = request.get("sampling_params") if dialect == "generate" else request
    return source if isinstance(source, dict) else {}


def _choices(dialect: str, request: dict[str, Any]) -> int:
    """How many choices the reply has (``n``)."""
    choices = _sampling(dialect, request).get("n") if dialect != "responses" else 1
    return choices if type(choices) is int and choices > 1 else 1


def _experts_start(dialect: str, request: dict[str, Any]) -> int:
    """The request's ``routed_experts_prompt_start``, 0 when unset."""
    start = _sampling(dialect, request).get("routed_experts_prompt_start")
    return start if type(start) is int and start > 0 else 0


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(token) is int for token in value)


def _resumable(record: TokenRecord) -> bool:
    """An aborted generation with its arrays whole: never usable alone, but a later call may
    resume it, so its entry is written and the trajectory stitches the two (issue 32)."""
    return record.finish_reason == "abort" and not record.missing and record.problem is None


class AddedFields(Protocol):
    """What cutting a reply's added fields reads of its call (a `CallExchange`, or the token line's view)."""

    dialect: str
    added_request_fields: Optional[dict[str, Any]]
    parsed_request: Optional[dict[str, Any]]


def agent_view(exchange: AddedFields, response: Any) -> Optional[dict[str, Any]]:
    """The captured response (parsed) as the agent saw it: the values the mode added replaced as
    the cutter replaced them in the agent's bytes (a streamed reply rebuilt has a body's shape);
    None when nothing was added (the agent asked for the arrays: they are its own)."""
    added = exchange.added_request_fields
    if not added or not isinstance(response, dict):
        return None
    return AddedFieldCutter(exchange.dialect, added, exchange.parsed_request or {}).cut_parsed(response)


def cut_in_place(exchange: AddedFields, response: dict[str, Any]) -> list[tuple[Any, Any, Any]]:
    """`agent_view` on ``response`` itself; what was replaced, as (container, key, value), so
    that `restore` can put it back."""
    cutter = AddedFieldCutter(exchange.dialect, exchange.added_request_fields or {}, exchange.parsed_request or {})
    replaced = []
    for path, replacement in cutter.rules(response):
        container: Any = response
        for step in path[:-1]:
            container = container[step]
        replaced.append((container, path[-1], container[path[-1]]))
        if replacement == REMOVE_MEMBER:  # SGLang's ``sglext``: the agent's reply has no such member.
            del container[path[-1]]
        else:
            container[path[-1]] = orjson.loads(replacement)
    return replaced


def restore(replaced: list[tuple[Any, Any, Any]]) -> None:
    for container, key, value in reversed(replaced):
        container[key] = value


#: The token files of this process by directory (`files_of`).
_FILES: dict[str, TokenFiles] = {}
_FILES_LOCK = threading.Lock()


def files_of(directory: str) -> TokenFiles:
    """This process's `TokenFiles` of ``directory``: the sidecar's own (a writer thread's line),
    else one made once (the capture process's)."""
    with _FILES_LOCK:
        found = _FILES.get(directory)
        if found is None:
            found = _FILES[directory] = TokenFiles(directory)
        return found


#: The notes `EntryWriter` leaves and `TokenCapture.take_notes` takes (nothing else is called).
_NOTES = frozenset({"_count", "_fail", "_unusable", "_indexed", "_no_experts", "_experts_not_stored"})
#: An entry's keys its lineage node is made of (`RolloutLineage.add`): the arrays stay in the file.
_LINEAGE_KEYS = ("model_call_id", "cum_len", "digest", "continuation_context_len", "continuation_context_digest",
                 "parent_call_id", "prompt_is_delta", "finish_reason", "continuation_fingerprint", "fingerprint_version")


def lineage_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """What the lineage takes of an entry just written (`TokenCapture._indexed`): its keys without
    the arrays, the last token kept (a sequence's end is found by it)."""
    kept = {key: entry[key] for key in _LINEAGE_KEYS if key in entry}
    for key in ("generation_token_ids", "prompt_token_ids"):
        ids = entry.get(key)
        kept[key] = ids[-1:] if isinstance(ids, list) else ids
    return kept


def mark_incomplete(files: TokenFiles, plan: TokenPlan, exc: BaseException) -> tuple[str, str, str, str]:
    """The plan's entries marked incomplete (they may be lost); the words to say (`TokenCapture._fail`)."""
    for entry_id in plan.entry_ids:
        try:
            files.mark_incomplete(plan.rollout_id, entry_id)
        except OSError:
            pass
    return type(exc).__name__, plan.rollout_id, plan.entry_ids[0], f"its entry could not be written: {exc}"


def _settle(future: "asyncio.Future[None]") -> None:
    if not future.done():  # A call cancelled meanwhile gave it up.
        future.set_result(None)
