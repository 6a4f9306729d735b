"""Redaction in a call (docs/privacy.md): `RedactionHooks` redacts the line's fields first among the
call's hooks, before the token capture mode writes its entries from them and before the journal
writes the line. A hook that raises or runs past its budget leaves the line in metrics-only form,
marked ``redaction_failed``, counted and logged without content: never the value it was given.

With a hook, each line is prepared on a pool of its own (``--redact-hook-workers`` threads) as soon
as it is ready, beside every other line's, and its budget counts from then: the line joins the
journal's queue only once redacted, or at its budget's end in metrics-only form, so a slow hook
holds back its own line and no other (issue 73: lines had queued behind one hook runner, each
waiting its full budget). A hook still running past its budget keeps its thread until it returns;
with every thread so taken, a new line's budget runs out waiting and it is written metrics-only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

import yaml
from prometheus_client import CollectorRegistry, Counter

from capture import Redactor, RedactionConfigError, RolloutPlaceholders, load_rules, metrics_only

from ..call import CallHooks

if TYPE_CHECKING:
    from ..call import CallExchange

log = logging.getLogger("mcc.privacy")


class RedactionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.failures = Counter("mcc_redaction_failures_total", "Lines written in metrics-only form because "
                                "redaction failed (the hook raised or ran past its budget), by kind.", ["kind"],
                                registry=registry)
        self.redactions = Counter("mcc_redactions_total", "Values replaced by redaction, by rule (hook: the hook "
                                  "changed a text).", ["rule"], registry=registry)


def load_redaction(rules_file: Optional[str], hook: Optional[str]) -> tuple[tuple[Any, ...], Optional[Callable[[str], str]]]:
    """The rules of ``--redact FILE`` and the callable of ``--redact-hook module:function``;
    `RedactionConfigError` in one sentence for anything that cannot be used (fail closed)."""
    rules: tuple[Any, ...] = ()
    if rules_file is not None:
        try:
            with open(rules_file, encoding="utf-8") as handle:
                document = yaml.safe_load(handle)
        except (OSError, yaml.YAMLError) as exc:
            raise RedactionConfigError(f"--redact {rules_file}: {exc}") from None
        rules = load_rules(document, f"--redact {rules_file}")
    function = None
    if hook is not None:
        module_name, _, name = hook.partition(":")
        try:
            function = getattr(importlib.import_module(module_name), name) if name else None
        except (ImportError, AttributeError) as exc:
            raise RedactionConfigError(f"--redact-hook {hook}: {exc}") from None
        if not callable(function):
            raise RedactionConfigError(f"--redact-hook {hook}: expected module:function naming a callable")
    return rules, function


class Redaction:
    """The sidecar's redaction: what every line goes through."""

    def __init__(self, metrics: RedactionMetrics, rules: tuple[Any, ...], hook: Optional[Callable[[str], str]],
                 budget: float, metrics_only: bool, keep_token_ids: bool, key: bytes, hook_workers: int = 16) -> None:
        self.metrics = metrics
        self.redactor = Redactor(rules, hook)
        self.budget = budget
        self.metrics_only = metrics_only
        self.keep_token_ids = keep_token_ids
        #: The placeholders' key (`RolloutPlaceholders`): shared by a supervisor's workers.
        self._key = key
        #: Lines are prepared here, so that a hook past its budget is left behind, not waited for.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=hook_workers, thread_name_prefix="mcc-redact")
        #: Lines being prepared (`prepare`), and set when there are none (`quiet`).
        self._preparing = 0
        self._quiet = asyncio.Event()
        self._quiet.set()

    @property
    def prepares_lines(self) -> bool:
        """Whether lines are prepared aside (a hook is set, and lines are not metrics-only)."""
        return self.redactor.hook is not None and not self.metrics_only

    def prepare(self, rollout_id: str, make_fields: Callable[[], dict[str, Any]],
                ready: Callable[[Optional[dict[str, Any]]], None]) -> None:
        """On the loop: make the line's fields and redact them on the pool, then ``ready(fields)``
        on the loop -- redacted, or in metrics-only form once ``budget`` seconds have passed since
        now, or the hook raised."""
        loop = asyncio.get_running_loop()
        made: dict[str, Any] = {}
        fields_made = threading.Event()
        finished = False
        timer: Optional[asyncio.TimerHandle] = None
        self._preparing += 1
        self._quiet.clear()

        def work() -> tuple[dict[str, Any], dict[str, int]]:  # On the pool.
            fields = made["fields"] = make_fields()
            fields_made.set()
            copy = dict(fields)  # The walk makes new values: ``fields`` stays as it came.
            return copy, self.redactor.redact_line(copy, self.placeholders(rollout_id))

        def finish(fields: Optional[dict[str, Any]]) -> None:
            nonlocal finished
            finished = True
            if timer is not None:
                timer.cancel()
            self._preparing -= 1
            if not self._preparing:
                self._quiet.set()
            ready(fields)

        def done(future: "concurrent.futures.Future[tuple[dict[str, Any], dict[str, int]]]") -> None:  # On the loop.
            if finished:
                return  # Past its budget already: written metrics-only.
            if future.exception() is not None:
                exc = future.exception()
                if not fields_made.is_set():  # Our own fields failed, not the hook: built again where the
                    finish(None)              # journal builds, the failure is a capture failure, counted.
                    return
                fields = made["fields"]
                self._failed(rollout_id, fields, "error", f"the redaction hook raised {type(exc).__name__}")
                finish(fields)
                return
            fields, counts = future.result()
            self._counted(fields, counts)
            finish(fields)

        def past_budget() -> None:  # On the loop.
            if finished:
                return
            if not fields_made.is_set():  # The fields are ours and bounded: a moment more.
                nonlocal timer
                timer = loop.call_later(0.01, past_budget)
                return
            fields = made["fields"]
            self._failed(rollout_id, fields, "timeout", f"the redaction hook ran past its budget of {self.budget} s")
            finish(fields)

        def back_on_the_loop(future: "concurrent.futures.Future[Any]") -> None:  # On the pool.
            try:
                loop.call_soon_threadsafe(done, future)
            except RuntimeError:  # The loop has closed: a hook that outlived the sidecar, long written off.
                pass

        timer = loop.call_later(self.budget, past_budget)
        self._pool.submit(work).add_done_callback(back_on_the_loop)

    async def quiet(self) -> None:
        """Every line being prepared has been handed on (at most a budget from now)."""
        await self._quiet.wait()

    def hooks(self) -> "RedactionHooks":
        return RedactionHooks(self)

    def placeholders(self, rollout_id: str) -> RolloutPlaceholders:
        return RolloutPlaceholders(self._key, rollout_id)

    def redact(self, rollout_id: str, fields: dict[str, Any]) -> None:
        """``fields`` redacted in place (on a writer thread)."""
        if self.metrics_only:
            metrics_only(fields, self.keep_token_ids)
            fields["privacy"] = "metrics-only"
            return
        placeholders = self.placeholders(rollout_id)
        try:
            if self.redactor.hook is None:
                counts = self.redactor.redact_line(fields, placeholders)
            else:
                copy = dict(fields)
                counts = self._pool.submit(self.redactor.redact_line, copy, placeholders).result(timeout=self.budget)
                fields.update(copy)
        except concurrent.futures.TimeoutError:
            self._failed(rollout_id, fields, "timeout", f"the redaction hook ran past its budget of {self.budget} s")
            return
        except Exception as exc:  # The hook's own failure: its message may hold content, so only its type is said.
            self._failed(rollout_id, fields, "error", f"the redaction hook raised {type(exc).__name__}")
            return
        self._counted(fields, counts)

    def _counted(self, fields: dict[str, Any], counts: dict[str, int]) -> None:
        if counts:
            fields["redactions"] = counts
            for rule, count in counts.items():
                self.metrics.redactions.labels(rule).inc(count)

    def _failed(self, rollout_id: str, fields: dict[str, Any], kind: str, said: str) -> None:
        metrics_only(fields, False)
        fields["redaction_failed"] = True
        self.metrics.failures.labels(kind).inc()
        log.warning("redaction of call %s of rollout %s failed: %s; its line is written in metrics-only form "
                    "(mcc_redaction_failures_total)", fields.get("model_call_id"), rollout_id, said,
                    extra={"rollout_id": rollout_id, "kind": kind})


class RedactionHooks(CallHooks):
    """Redaction's part in one call: the line phase, first among the call's hooks."""

    __slots__ = ("redaction",)
    #: Its time is the call's ``redaction`` (docs/speed.md, "Overhead by part").
    overhead_part = "redaction"

    def __init__(self, redaction: Redaction) -> None:
        self.redaction = redaction

    @property
    def prepares_line(self) -> bool:  # type: ignore[override]  # a property where the base has a class attribute
        """A hook's call (which may take up to its budget) runs on the redaction pool, beside other
        lines' (`Redaction.prepare`); rules alone run where the journal builds the line."""
        return self.redaction.prepares_lines

    def prepare_line(self, exchange: "CallExchange", make_fields: Callable[[], dict[str, Any]],
                     ready: Callable[[Optional[dict[str, Any]]], None]) -> None:
        self.redaction.prepare(exchange.rollout_id, make_fields, ready)

    def line_fields(self, exchange: "CallExchange", fields: dict[str, Any]) -> None:
        self.redaction.redact(exchange.rollout_id, fields)
