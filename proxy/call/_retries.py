"""Which earlier call of its rollout a request repeats (issue 31, point 2; issue 44, point 5): an
SDK's retry (``x-stainless-retry-count``), any identical resend, and a resend re-serialised with its
keys in another order (Codex CLI rewrites ``client_metadata`` when it reconnects after a cut
stream). The call records the repeated call's id (``retry_of``); lineage collapses identical
retries on its own (same sequence).

Two keys per call, each two numbers (length and Python's hash), nothing else of a body kept:
- the bytes, at once, as the call opens (C, computed once per body: no parse on the hot path);
- the JSON, key order and whitespace aside (`note_json`), taken where the request is parsed
  anyway: when the line is built (on the loop for a small call, else on the writer's thread), or by
  the token mode, which parses it first.
Within one rollout's last calls a hash collision is not a practical concern.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Optional

import orjson

#: Calls remembered per rollout, and rollouts remembered.
_CALLS_KEPT = 64
_ROLLOUTS_KEPT = 4096


class RetryMemory:
    """The recent request bodies of each rollout (bytes and JSON keys). Noted from the event loop
    and from the line's thread, hence the lock (uncontended: a few hundred nanoseconds)."""

    def __init__(self) -> None:
        self._bytes = _Keys()
        self._json = _Keys()
        self._lock = threading.Lock()

    def note(self, rollout_id: str, body: bytes, model_call_id: str) -> Optional[str]:
        """The id of the latest earlier call of ``rollout_id`` with this exact body, if any; this
        call becomes the latest with it."""
        with self._lock:
            return self._bytes.note(rollout_id, (len(body), hash(body)), model_call_id)

    def note_json(self, rollout_id: str, request: Any, model_call_id: str) -> Optional[str]:
        """The id of the latest earlier call of ``rollout_id`` whose parsed request equals
        ``request`` as JSON (object key order aside), if any; this call becomes the latest with it."""
        try:
            canonical = orjson.dumps(request, option=orjson.OPT_SORT_KEYS)
        except (TypeError, orjson.JSONEncodeError):  # An integer beyond 64 bits: no JSON key.
            return None
        with self._lock:
            return self._json.note(rollout_id, (len(canonical), hash(canonical)), model_call_id)


class _Keys:
    """Per rollout (least recently used first), each key's latest call id."""

    def __init__(self) -> None:
        self._rollouts: OrderedDict[str, OrderedDict[tuple[int, int], str]] = OrderedDict()

    def note(self, rollout_id: str, key: tuple[int, int], model_call_id: str) -> Optional[str]:
        calls = self._rollouts.get(rollout_id)
        if calls is None:
            calls = self._rollouts[rollout_id] = OrderedDict()
            if len(self._rollouts) > _ROLLOUTS_KEPT:
                self._rollouts.popitem(last=False)
        else:
            self._rollouts.move_to_end(rollout_id)
        earlier = calls.pop(key, None)
        calls[key] = model_call_id
        if len(calls) > _CALLS_KEPT:
            calls.popitem(last=False)
        return earlier if earlier != model_call_id else None
