"""A call's capture line: its fields from the exchange, the hooks' fields, then to the journal (docs/files.md).

``build_line`` runs where the journal says (on the loop for a small call, else on a thread), once
the reply has ended: it parses the request and finishes the tap there, not on the way to the
first byte.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, Callable, Optional

from capture.journal import Built, Journal
from records.contract.writing import engine_weight_versions

from ._context import CallHooks
from ._exchange import CallExchange
from ._overhead import CallOverhead


def submit_line(journal: Journal, exchange: CallExchange, hooks: tuple[CallHooks, ...],
                settled: Callable[[bool], None], overhead: Optional[CallOverhead] = None) -> None:
    """The call's line to the journal; ``settled(written)`` on the loop once durable or failed. A
    hook that prepares the line (a redaction hook) gets its fields first, beside other calls' lines,
    and the line joins the journal's queue only once they are ready: it never holds another back.
    ``overhead``: the call's parts, where the line's build, its hooks' part and its durability's
    wait are added (docs/speed.md, "Overhead by part")."""
    tap = exchange.tap
    size = len(exchange.request_body) + (tap.bytes_seen if tap is not None else 0)
    preparer = next((hook for hook in hooks if hook.prepares_line), None) if hooks else None
    if overhead is not None:
        settled = _timed_settle(overhead, settled)
    if preparer is None:
        journal.submit(exchange.rollout_id, lambda: build_line(exchange, hooks, None, overhead), size, settled)
        return
    started = perf_counter()

    def ready(fields: Optional[dict[str, Any]]) -> None:
        if overhead is not None:  # The preparer's part, its wait for the pool included.
            overhead.add(preparer.overhead_part, perf_counter() - started)
        journal.submit(exchange.rollout_id, lambda: build_line(exchange, hooks, fields, overhead), size, settled)
    preparer.prepare_line(exchange, lambda: line_fields_of(exchange), ready)


def _timed_settle(overhead: CallOverhead, settled: Callable[[bool], None]) -> Callable[[bool], None]:
    """``settled``, and the wait from the line's build to it as ``durable``."""
    def timed(written: bool) -> None:
        if overhead.built_at:
            overhead.durable = perf_counter() - overhead.built_at
        settled(written)
    return timed


def line_fields_of(exchange: CallExchange) -> dict[str, Any]:
    """The line's fields as the exchange has them, before any hook's."""
    fields = exchange.capture_fields()
    engine = engine_weight_versions(fields.get("response"))
    if engine is not None:  # The engine named its weights (issue 32): that, whatever was declared.
        fields["weight_versions"], fields["weight_version_source"] = engine, "engine"
    return fields


def build_line(exchange: CallExchange, hooks: tuple[CallHooks, ...], prepared: Optional[dict[str, Any]] = None,
               overhead: Optional[CallOverhead] = None) -> Built:
    """The line's fields (or, from a hook that writes it, the line); ``prepared``: the fields a
    hook prepared (`submit_line`), whose own `line_fields` work is done. ``overhead``: the build's
    time is added to the call's ``line``, a hook's own part (`CallHooks.overhead_part`) to that."""
    started = perf_counter()
    own = 0.0
    fields = line_fields_of(exchange) if prepared is None else prepared
    for hook in hooks:
        if "line_fields" in hook.phases and (prepared is None or not hook.prepares_line):
            if overhead is not None and hook.overhead_part != "line":
                hook_started = perf_counter()
                hook.line_fields(exchange, fields)
                took = perf_counter() - hook_started
                overhead.add(hook.overhead_part, took)
                own += took
            else:
                hook.line_fields(exchange, fields)
    built: Built = fields
    for hook in hooks:
        if "line" in hook.phases:
            line = hook.line(exchange, fields)
            if line is not None:
                built = line
                break
    if overhead is not None:
        overhead.built_at = perf_counter()
        overhead.add("line", overhead.built_at - started - own)
    return built

