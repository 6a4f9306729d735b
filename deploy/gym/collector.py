"""A collector: clear captures before dispatch, attach them to each rollout record afterwards."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from records import attach_model_call_capture, clear_model_call_captures, rollout_id_from_run


async def collect(run_requests: list[dict[str, Any]], run: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
                  capture_dir: str) -> list[dict[str, Any]]:
    """Run every rollout; return its record with `ng_model_call_capture` attached."""
    rollout_ids = [rollout_id_from_run(request, observability_enabled=True) for request in run_requests]
    clear_model_call_captures([rid for rid in rollout_ids if rid], capture_dir)  # A redispatch starts clean.
    records = []
    for request in run_requests:
        rollout_record = await run(request)
        records.append(attach_model_call_capture(rollout_record, capture_dir))
    return records
