"""Persisting capture lines, and what happens when that fails (DESIGN §3, §5).

Outside the token capture mode each line is built on the event loop and appended by the capture
process (`_capture_process`; issue 34): the appends' syscalls no longer take turns with the event
loop for one interpreter lock, and the lines of calls that end together share one durability
barrier. A large call's line goes as its fields, and the process encodes it
(`ENCODE_IN_PROCESS_BYTES`). In the token capture mode -- a line's training-token entries are
written first, in the same barrier -- and wherever the process cannot run, serialisation and the
durable append run on writer threads with group commit (`capture.GroupCommitter`). A failure never
reaches the client: it is logged once per rollout and kind, counted, and the rollout is marked
``.capture.incomplete`` where the disk still allows it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from capture import (
    PERSIST_FIELDS,
    PERSIST_LINE,
    AlsoDurable,
    GroupCommitter,
    StreamTap,
    create_incomplete_marker,
    encode_pickled_fields,
    pickle_fields,
    proves_prefix,
)
from records import (
    capture_path,
    encode_capture_line,
    engine_weight_versions,
    incomplete_marker_path,
    token_records_of_line,
)

from ._process_client import CaptureProcess, Unsent
from proxy.call._exchange import CallExchange
from proxy.app._logging import RepeatLimiter
from proxy.call._metrics import SidecarMetrics

from proxy.training._entry_writer import agent_view, cut_in_place, restore

if TYPE_CHECKING:
    from proxy.training._entry_writer import TokenCapture

log = logging.getLogger("mcc.capture")
_PATHS_KEPT = 4096
#: A call whose request and reply together exceed this has its line built on a thread of its own,
#: not on the event loop: a line takes about 3 µs a KB to build (a 32k-token stream's 14 MB line:
#: 45 ms, every other call's bytes stalled meanwhile), and a thread hands the interpreter lock
#: back to the loop every 5 ms. Below it (a 1 KB JSON call, an 85 KB logprob stream) the loop
#: builds it at once, saving two thread hops (issue 34).
BUILD_ON_LOOP_BYTES = 256 * 1024
#: A call whose request and reply together reach this sends the capture process its line's
#: fields pickled, and the process encodes them: a streamed call's line is mostly its raw text,
#: and escaping it is one C call holding the interpreter (measured: a 256-event stream's 54 KB
#: line, 42 µs to encode against 3.6 µs to pickle; a 14 MB one, 40 ms). Below it a line is
#: encoded here: a 1 KB JSON call's takes 2.1 µs, no more than pickling it.
ENCODE_IN_PROCESS_BYTES = 16 * 1024


class CaptureWriter:
    """Appends one line per call to ``<capture_dir>/<rollout_id>.capture.jsonl``."""

    def __init__(self, capture_dir: str, metrics: SidecarMetrics, sync_mode: str = "auto",
                 token_capture: "TokenCapture | None" = None, process: bool = False) -> None:
        """``process``: append through a capture process (calls outside the token capture mode)."""
        self.capture_dir = capture_dir
        #: Writes a call's training-token entry just before its line (DESIGN §12).
        self._token_capture = token_capture
        self._metrics = metrics
        self._loop = asyncio.get_running_loop()
        self._sync_mode = sync_mode
        self._process: Optional[CaptureProcess] = None
        if process:
            try:
                self._process = CaptureProcess(capture_dir, sync_mode, self._process_lost)
            except Exception as exc:  # OSError (no memory, no pids), or no interpreter to run it (embedded).
                log.warning("cannot start the capture process (%s): the sidecar appends its lines itself", exc)
        self._committer = GroupCommitter(sync_mode, directory=capture_dir) if self._process is None else None
        #: Builds the lines of large calls for the capture process (`BUILD_ON_LOOP_BYTES`).
        self._builder: Optional[ThreadPoolExecutor] = None
        self._building = 0
        self._built = asyncio.Event()
        self._built.set()
        #: A read-only or full volume fails every rollout's lines: said once per kind of failure,
        #: then as a count a minute (10k rollouts are not 10k log lines; issue 21).
        self._repeated = RepeatLimiter(log, interval=60.0)
        #: Capture file path by rollout id, for the rollouts of the last while.
        self._paths: dict[str, str] = {}
        self._failing: set[asyncio.Task[None]] = set()
        # Lines settled on the writer threads, handed to the event loop in one callback per batch.
        self._settled: list[tuple[Callable[[bool], None], str, int, object]] = []
        self._settled_lock = threading.Lock()
        self.lines_written = 0
        self.failures: Counter[str] = Counter()
        #: Why the last line could not be written to disk (``ENOSPC: ...``), None once one is:
        #: what `/-/ready` and `mcc_capture_dir_writable` report, beside the directory's mode.
        self.write_problem: str | None = None

    def submit(self, exchange: CallExchange, on_settled: Callable[[bool], None]) -> None:
        """Queue the call's line; ``on_settled(written)`` runs on the event loop once the line is
        durable, or once its failure is counted, logged and marked. Never raises."""
        rollout_id = exchange.rollout_id

        def done(size: int, outcome: object) -> None:  # On a writer thread.
            with self._settled_lock:
                self._settled.append((on_settled, rollout_id, size, outcome))
                first = len(self._settled) == 1
            if first:
                self._loop.call_soon_threadsafe(self._settle_all)

        try:
            path = self._paths.get(rollout_id)
            if path is None:
                path = capture_path(self.capture_dir, rollout_id)  # Validates the id, once per rollout.
                if len(self._paths) >= _PATHS_KEPT:
                    self._paths.clear()
                self._paths[rollout_id] = path
            if self._process is None or exchange.token_plan is not None:
                self._threads().submit(path, lambda: self._line(exchange), done)
            else:
                size = _request_and_reply_bytes(exchange)
                if size <= BUILD_ON_LOOP_BYTES:
                    self._send(path, *self._payload(exchange, size), rollout_id, on_settled, done)
                else:
                    self._build_aside(exchange, size, path, on_settled, done)
        except Exception as exc:
            self._loop.call_soon(self._settle, on_settled, rollout_id, 0, exc)

    def _payload(self, exchange: CallExchange, size: int) -> tuple[bytes, int]:
        """What the capture process is sent of a call's line (``size``: its request and reply
        bytes): the line, or a large call's fields pickled (`ENCODE_IN_PROCESS_BYTES`), and which."""
        fields, _ = self._fields(exchange)
        _keep_cut_logprobs(exchange, fields)
        if size >= ENCODE_IN_PROCESS_BYTES:
            return pickle_fields(fields), PERSIST_FIELDS
        return encode_capture_line(fields), PERSIST_LINE

    def _send(self, path: str, payload: bytes, kind: int, rollout_id: str, on_settled: Callable[[bool], None],
              done: Callable[[int, object], None]) -> None:
        """A line built: to the capture process, or to the writer threads once it has died."""
        process = self._process
        if process is None:
            self._threads().submit(path, _line_of(payload, kind), done)
            return
        process.submit(os.fsencode(path), payload,
                       lambda size, outcome: self._settle(on_settled, rollout_id, size, outcome), kind)

    def _build_aside(self, exchange: CallExchange, size: int, path: str, on_settled: Callable[[bool], None],
                     done: Callable[[int, object], None]) -> None:
        """A large call's line, built on the builder thread, then sent from the loop."""
        if self._builder is None:
            self._builder = ThreadPoolExecutor(1, thread_name_prefix="mcc-capture-build")
        self._building += 1
        self._built.clear()
        building = self._builder.submit(self._payload, exchange, size)

        def built(future: "Future[tuple[bytes, int]]") -> None:  # On the loop.
            try:
                try:
                    payload, kind = future.result()
                except Exception as exc:
                    self._settle(on_settled, exchange.rollout_id, 0, exc)
                    return
                self._send(path, payload, kind, exchange.rollout_id, on_settled, done)
            finally:
                self._building -= 1
                if not self._building:
                    self._built.set()
        building.add_done_callback(lambda future: self._loop.call_soon_threadsafe(built, future))

    @property
    def process_pid(self) -> Optional[int]:
        """The capture process's pid; None while the writer threads append."""
        return self._process.pid if self._process is not None else None

    def _threads(self) -> GroupCommitter:
        if self._committer is None:
            self._committer = GroupCommitter(self._sync_mode, directory=self.capture_dir)
        return self._committer

    def _process_lost(self, unsent: "list[Unsent]") -> None:
        """The capture process died: from now on the writer threads append (`_capture_process`),
        first the lines it was never sent."""
        self._process = None
        threads, loop = self._threads(), self._loop
        for path, payload, kind, done in unsent:
            threads.submit(os.fsdecode(path), _line_of(payload, kind),
                           lambda size, outcome, done=done: loop.call_soon_threadsafe(done, size, outcome))

    def _line(self, exchange: CallExchange) -> Union[bytes, tuple[bytes, AlsoDurable]]:
        """The call's line; its training-token entry written first (on the writer thread), made
        durable by the line's own barrier (the entry's file is named with the line: both are on
        disk before the agent sees the end of the reply, for one flush where there were two)."""
        plan, token_capture = exchange.token_plan, self._token_capture
        if plan is None or token_capture is None:
            return self._line_and_entries(exchange, None)
        # The intent, when not flushed yet (`TokenPlan.intent_unflushed`), rides the same barrier.
        unsynced: list[str] = [plan.intent_unflushed] if plan.intent_unflushed is not None else []
        line = self._line_and_entries(exchange, unsynced)
        if not unsynced:
            return line
        return line, (unsynced, lambda exc: token_capture.not_durable(plan, exc))

    def _fields(self, exchange: CallExchange) -> tuple[dict[str, Any], Optional[bool]]:
        """The line's fields, and prefix supply's proof (`_prefix_proof`)."""
        fields = exchange.capture_fields()
        prefix = self._prefix_proof(exchange, fields)
        _note_weight_versions(exchange, fields)
        _note_resumption(exchange, fields)
        return fields, prefix

    def _line_and_entries(self, exchange: CallExchange, unsynced: Optional[list[str]]) -> bytes:
        fields, prefix = self._fields(exchange)
        if exchange.token_plan is not None and self._token_capture is not None:
            streamed = self._streamed_line(exchange, fields, prefix, unsynced)
            if streamed is not None:
                return streamed
        _keep_cut_logprobs(exchange, fields)
        line = encode_capture_line(fields)
        if exchange.token_plan is None or self._token_capture is None:
            return line
        parsed = self._token_capture.commit(exchange.token_plan, line, prefix, unsynced)
        if parsed is None:
            return line  # No entry holds the arrays: the line keeps them.
        # Linear storage (DESIGN §12): the arrays live once in the token file; the line keeps what
        # the agent saw (the added fields cut, as they were from its reply) and names the entries.
        seen = agent_view(exchange, parsed.get("response"))
        if seen is None:
            return line
        parsed["response"] = seen
        parsed["token_entries"] = list(exchange.token_plan.entry_ids)
        return encode_capture_line(parsed)

    def _prefix_proof(self, exchange: CallExchange, fields: dict[str, Any]) -> Optional[bool]:
        """Prefix supply's proof (DESIGN §12): the prompt ids the upstream reports begin with the
        ids supplied. On the line as ``prefix_supplied`` (or ``prefix_not_supplied``: why a call
        with a resolved parent went without); None when nothing was supplied."""
        supplied = exchange.supplied_prefix
        if supplied is None:
            if exchange.prefix_not_supplied is not None:
                fields["prefix_not_supplied"] = exchange.prefix_not_supplied
            return None
        response = fields.get("response")
        proved = isinstance(response, dict) and proves_prefix(response.get("prompt_token_ids"), supplied.prompt_token_ids)
        fields["prefix_supplied"] = proved
        self._metrics.prefix_supply.labels("proved" if proved else "unproved").inc()
        return proved

    def _streamed_line(self, exchange: CallExchange, fields: dict[str, Any], prefix: Optional[bool],
                       unsynced: Optional[list[str]] = None) -> bytes | None:
        """A chat stream in the token capture mode: the entries from the ids and logprobs the tap
        kept as they streamed, and the line of what the agent saw, without ever writing the
        arrays into a line and parsing them back (the tap's logprob entries are most of the
        bytes); None to take the general way (another dialect, another shape, an entry not written)."""
        tap, response = exchange.tap, fields.get("response")
        collected = tap.collected_arrays() if isinstance(tap, StreamTap) else None
        if not collected or not isinstance(response, dict) or not exchange.added_request_fields:
            return None
        prompt = response.get("prompt_token_ids")
        replaced = cut_in_place(exchange, response)
        records = []
        for record in token_records_of_line(fields, exchange.rollout_id, 0):
            ids, logprobs = collected.get(record.choice_index, (None, None))
            if type(prompt) is not list or ids is None or logprobs is None or len(ids) != len(logprobs):
                restore(replaced)
                _put_back_logprobs(response, collected)
                return None
            records.append(record.model_copy(update={"prompt_token_ids": prompt, "generation_token_ids": ids,
                                                     "generation_log_probs": logprobs, "missing": (), "problem": None}))
        if not self._token_capture.commit_records(exchange.token_plan, records, response, prefix,  # type: ignore[union-attr]
                                                  unsynced):
            restore(replaced)  # Not every choice has its entry: the line keeps the arrays (never tried twice).
            _put_back_logprobs(response, collected)
            return encode_capture_line(fields)
        fields["token_entries"] = list(exchange.token_plan.entry_ids)
        return encode_capture_line(fields)

    async def persist(self, exchange: CallExchange) -> bool:
        """`submit`, awaited: True once the line is durable, False (never raise) on failure."""
        future: asyncio.Future[bool] = self._loop.create_future()
        self.submit(exchange, lambda written: future.done() or future.set_result(written))
        return await asyncio.shield(future)  # A cancelled handler still lets the line be written.

    async def close(self) -> None:
        """Every line submitted is durable or failed (settled), and the writer has stopped."""
        await self._built.wait()  # The lines still being built are sent first.
        if self._builder is not None:
            self._builder.shutdown(wait=False)
        if self._process is not None:
            await self._process.close()
        if self._committer is not None:
            await self._loop.run_in_executor(None, self._committer.close)

    def _settle_all(self) -> None:
        with self._settled_lock:
            settled, self._settled = self._settled, []
        for on_settled, rollout_id, size, outcome in settled:
            self._settle(on_settled, rollout_id, size, outcome)

    def _settle(self, on_settled: Callable[[bool], None], rollout_id: str, size: int, outcome: object) -> None:
        if isinstance(outcome, BaseException):
            task = self._loop.create_task(self._fail_then(on_settled, rollout_id, outcome))
            self._failing.add(task)
            task.add_done_callback(self._failing.discard)
            return
        self.lines_written += 1
        if self.write_problem is not None:
            log.warning("capture lines are written to %s again", self.capture_dir, extra={"path": self.capture_dir})
            self.write_problem = self._metrics.capture_write_problem = None
        metrics = self._metrics
        metrics.capture_lines.inc()
        metrics.capture_bytes.inc(size)
        metrics.fsync_duration.observe(outcome)  # type: ignore[arg-type]
        on_settled(True)

    async def _fail_then(self, on_settled: Callable[[bool], None], rollout_id: str, exc: BaseException) -> None:
        try:
            await self._on_failure(rollout_id, exc)
        finally:
            on_settled(False)

    async def _on_failure(self, rollout_id: str, exc: BaseException) -> None:
        kind = failure_kind(exc)
        self.failures[kind] += 1
        if isinstance(exc, OSError):  # The disk refused it (ENOSPC, EDQUOT, EIO, EROFS, ...), not a bug.
            self.write_problem = self._metrics.capture_write_problem = f"{kind}: {exc.strerror or exc}"
        self._metrics.capture_failures.labels(kind).inc()
        self._repeated.error(kind, "capture failed for rollout %s (%s) in %s: %s; the call was forwarded unchanged; "
                             "further %s failures are counted (mcc_capture_failures_total) and said once a minute",
                             rollout_id, kind, self.capture_dir, exc, kind,
                             extra={"rollout_id": rollout_id, "errno": getattr(exc, "errno", None),
                                    "path": self.capture_dir, "kind": kind})
        marker = incomplete_marker_path(self.capture_dir, rollout_id)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, create_incomplete_marker, marker)
        except Exception:
            pass  # The directory may be gone or read-only; the failure is already counted.


def _request_and_reply_bytes(exchange: CallExchange) -> int:
    tap = exchange.tap
    return len(exchange.request_body or b"") + (tap.bytes_seen if tap is not None else 0)


def _line_of(payload: bytes, kind: int) -> Callable[[], bytes]:
    """How a writer thread gets the line of a capture process's payload."""
    return (lambda: payload) if kind == PERSIST_LINE else (lambda: encode_pickled_fields(payload))


def _keep_cut_logprobs(exchange: CallExchange, fields: dict[str, Any]) -> None:
    """A stream whose logprobs the cutter cut kept floats, not entries, in its fold: the line
    gets them back (`_put_back_logprobs`)."""
    tap = exchange.tap
    if isinstance(tap, StreamTap) and tap.cutter is not None and tap.cutter.cuts_logprobs \
            and isinstance(fields.get("response"), dict):
        _put_back_logprobs(fields["response"], tap.collected_arrays() or {})


def _put_back_logprobs(response: dict[str, Any], collected: dict[int, Any]) -> None:
    """The line keeps the arrays after all (an entry was not written): logprobs whose entries the
    stream's fold did not keep (`ChatReassembler.keep_logprob_entries`) go back as ``{"logprob"}``
    entries -- what a trainer reads of them -- so nothing is lost."""
    for choice in response.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        logprobs = choice.get("logprobs")
        floats = collected.get(choice.get("index"), (None, None))[1]
        if floats is not None and isinstance(logprobs, dict) and logprobs.get("content") is None:
            choice["logprobs"] = {**logprobs, "content": [{"logprob": value} for value in floats]}


def _note_resumption(exchange: CallExchange, fields: dict[str, Any]) -> None:
    """``resumes``: this call continues an aborted one -- its parent ended ``abort`` and the prompt
    the upstream reports is that call's prompt + partial generation, exactly (issue 32)."""
    plan = exchange.token_plan
    if plan is None or not plan.verdict.parent_aborted:
        return
    response = fields.get("response")
    prompt = response.get("prompt_token_ids") if isinstance(response, dict) else None
    choices = response.get("choices") if isinstance(response, dict) else None
    if prompt is None and isinstance(choices, list) and choices and isinstance(choices[0], dict):
        prompt = choices[0].get("prompt_token_ids")  # Completions: on the choice.
    if prompt == plan.verdict.parent_sequence:
        fields["resumes"] = plan.verdict.parent_call_id


def _note_weight_versions(exchange: CallExchange, fields: dict[str, Any]) -> None:
    """The line's weight versions (issue 32): the engine's when the reply names them, else the
    trainer's declared ones as this call saw them (`records._weight_versions`)."""
    response = fields.get("response")
    engine = engine_weight_versions(response)
    if engine is not None:
        fields["weight_versions"], fields["weight_version_source"] = engine, "engine"
        return
    watch = exchange.weight_watch
    if watch is None or exchange.status_code is None:
        return
    choices = response.get("choices") if isinstance(response, dict) else None
    indexes = [choice.get("index", position) if isinstance(choice, dict) else position
               for position, choice in enumerate(choices)] if isinstance(choices, list) and choices else [0]
    fields.update(watch.line_fields(indexes))


def failure_kind(exc: BaseException) -> str:
    """A short stable name for a capture failure: the errno name for OS errors."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, f"errno{exc.errno}")
    return type(exc).__name__

