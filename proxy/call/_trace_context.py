"""W3C trace context on a captured call's upstream request (`records.contract.traceparent`)."""

from __future__ import annotations

from typing import Optional

from records.contract.writing import traceparent

from ..http import Headers


def with_trace_context(headers: Headers, rollout_id: str, model_call_id: str,
                       sent: Optional[dict[bytes, bytes]] = None) -> Headers:
    """``headers`` with a W3C ``traceparent`` for the call appended, unless the agent sent its own:
    its trace is the one it chose, and a second one would be ambiguous. ``sent``: the agent's
    fields by lower-case name (`ServerRequest.fields`), when known."""
    if b"traceparent" in sent if sent is not None else any(name.lower() == b"traceparent" for name, _ in headers):
        return headers
    return [*headers, (b"traceparent", traceparent(rollout_id, model_call_id).encode("ascii"))]
