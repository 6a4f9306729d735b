"""A collector with NeMo Gym's entry points: clear before dispatch, merge the captures afterwards.

Gym's own rollout collection does the same when run with deploy/gym/gym_config.yaml; this is for
harnesses that collect rows themselves. `clear_model_call_captures_for_rollouts` and
`merge_model_call_capture_into_record` have Gym's signatures (rows, a list of capture dirs).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Mapping

from records import clear_model_call_captures_for_rollouts, merge_model_call_capture_into_record


async def collect(rows: list[Mapping[str, Any]], run: Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]],
                  capture_dirs: list[str]) -> list[dict[str, Any]]:
    """Run every row; return its record with ``ng_model_call_capture`` attached (in place)."""
    clear_model_call_captures_for_rollouts(rows, capture_dirs)  # A redispatched attempt starts clean.
    records = []
    for row in rows:
        record = await run(row)
        records.append(merge_model_call_capture_into_record(record, capture_dirs))
    return records
