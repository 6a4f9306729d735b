"""Which earlier call of its rollout a request repeats (issue 31, point 2): an SDK's retry
(``x-stainless-retry-count``) or any identical resend carries the same body. The call records the
repeated call's id (``retry_of``); lineage collapses identical retries on its own (same sequence).

Bodies are compared by length and Python's hash of the bytes (C, computed once per body): within
one rollout's last calls a collision is not a practical concern, and nothing is kept of a body but
those two numbers.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

#: Calls remembered per rollout, and rollouts remembered.
_CALLS_KEPT = 64
_ROLLOUTS_KEPT = 4096


class RetryMemory:
    """The recent request bodies of each rollout, on the event loop's thread."""

    def __init__(self) -> None:
        self._rollouts: OrderedDict[str, OrderedDict[tuple[int, int], str]] = OrderedDict()

    def note(self, rollout_id: str, body: bytes, model_call_id: str) -> Optional[str]:
        """The id of the latest earlier call of ``rollout_id`` with this exact body, if any; this
        call becomes the latest with it."""
        calls = self._rollouts.get(rollout_id)
        if calls is None:
            calls = self._rollouts[rollout_id] = OrderedDict()
            if len(self._rollouts) > _ROLLOUTS_KEPT:
                self._rollouts.popitem(last=False)
        else:
            self._rollouts.move_to_end(rollout_id)
        key = (len(body), hash(body))
        earlier = calls.pop(key, None)
        calls[key] = model_call_id
        if len(calls) > _CALLS_KEPT:
            calls.popitem(last=False)
        return earlier
