"""Where the sidecar's own time in one call goes, by part (docs/speed.md, "Overhead by part").

Gateways publish their overhead by part (Bifrost's buckets, LiteLLM's overhead header); a capture
proxy's is this: the time the sidecar spends on a call, outside the upstream's own, split into
the parts a call goes through. Each is a span of the sidecar's work on the call's path (never
the upstream's time, never the agent's), measured with two clock reads at most, once per call or
once per read -- never per event:

- ``request``: the request in, to its bytes handed to the upstream connection (the route, the
  exchange, the features' request work, the upstream's headers);
- ``connect``: a connection to the upstream, reused from the pool or made;
- ``head``: the upstream's head in, to the reply's head on its way to the agent;
- ``first_byte``: a stream's first read in, to its first bytes on their way to the agent;
- ``parse``: every read's events framed and folded (the tap), summed over the call;
- ``line``: the line built (the exchange's fields, the features' fields, the encoding), less
  ``redaction``: the privacy hooks' part of it;
- ``durable``: the line built, to the journal's word that it is durable (its fsync's wait).

`SidecarMetrics.call_overhead` keeps one histogram per part (``mcc_call_overhead_seconds``);
``--overhead-header`` puts what is known when the reply's head leaves in a ``Server-Timing``
header (`proxy.app.features.OverheadHeaderFeature`).
"""

from __future__ import annotations

from time import perf_counter
from typing import Optional

#: The parts, in a call's order (the histogram's ``part`` label).
OVERHEAD_PARTS = ("request", "connect", "head", "first_byte", "parse", "line", "redaction", "durable")
_LABELS = tuple((part,) for part in OVERHEAD_PARTS)


class CallOverhead:
    """One call's parts, in seconds (None: the call had no such part)."""

    __slots__ = ("started", "request", "connect", "head", "first_byte", "parse", "line", "redaction", "durable",
                 "head_at", "first_read_at", "built_at")

    def __init__(self) -> None:
        self.started = perf_counter()
        self.request: Optional[float] = None
        self.connect: Optional[float] = None
        self.head: Optional[float] = None
        self.first_byte: Optional[float] = None
        self.parse: Optional[float] = None
        self.line: Optional[float] = None
        self.redaction: Optional[float] = None
        self.durable: Optional[float] = None
        #: When the upstream's head came in (`head` runs from there).
        self.head_at = 0.0
        #: When a stream's first body read came in (`first_byte` runs from there).
        self.first_read_at = 0.0
        #: When the line was built (`durable` runs from there).
        self.built_at = 0.0

    def parts(self) -> tuple[tuple[tuple[str], Optional[float]], ...]:
        """Each part's histogram labels and seconds (None: the call had no such part)."""
        request, connect, head, first_byte, parse, line, redaction, durable = _LABELS
        return ((request, self.request), (connect, self.connect), (head, self.head), (first_byte, self.first_byte),
                (parse, self.parse), (line, self.line), (redaction, self.redaction), (durable, self.durable))

    def add_parse(self, seconds: float) -> None:
        self.parse = seconds if self.parse is None else self.parse + seconds

    def add(self, part: str, seconds: float) -> None:
        """``seconds`` more of ``part`` (a line hook's own part: ``redaction``)."""
        before = getattr(self, part)
        setattr(self, part, seconds if before is None else before + seconds)
