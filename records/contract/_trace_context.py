"""W3C Trace Context ids of a rollout and its calls, the same at request time and at export.

The sidecar sends ``traceparent: 00-<trace>-<span>-01`` upstream with each captured call
(`mcc serve --trace-context`, on by default), and `mcc export --format otel-json` writes the call's
span under those ids: vLLM (``--otlp-traces-endpoint``) continues the context it receives, so its
own spans of the call land in the rollout's trace, under the call's span. Both ids are derived,
never stored: the trace from the rollout id, the span from the call's ``model_call_id`` (a random
UUID the sidecar chooses before it forwards the request).
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Optional

__all__ = ["call_span_id", "rollout_trace_id", "traceparent"]


@functools.lru_cache(maxsize=4096)  # Asked on every captured call of a rollout (its traceparent).
def rollout_trace_id(rollout_id: str) -> str:
    """The rollout's trace id: 32 hex digits, the same every time (never all zeros)."""
    digest = hashlib.md5(rollout_id.encode()).hexdigest()
    return digest if digest.strip("0") else "1".rjust(32, "0")


def call_span_id(model_call_id: Optional[str], rollout_id: str = "", call_index: int = 0) -> str:
    """The call's span id, 16 hex digits: the first 16 of its ``model_call_id`` (a random UUID in
    hex), else derived from the rollout id and call index (a line without an id)."""
    if model_call_id and _HEX_ID.fullmatch(model_call_id[:16]) and model_call_id[:16].strip("0"):
        return model_call_id[:16].lower()
    return hashlib.md5(f"{rollout_id}/{call_index}".encode()).hexdigest()[:16]


def traceparent(rollout_id: str, model_call_id: str) -> str:
    """The ``traceparent`` header value a captured call is forwarded with (version 00, sampled)."""
    return f"00-{rollout_trace_id(rollout_id)}-{call_span_id(model_call_id)}-01"


_HEX_ID = re.compile(r"[0-9a-fA-F]{16}")
