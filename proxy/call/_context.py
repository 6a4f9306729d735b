"""What a call may use (`CallContext`), and how a feature takes part in it (`CallHooks`; docs/layout.md).

`CallContext`: in place of a back-reference to the whole sidecar, a call reads its settings, the
upstream pool, the journal, the metrics and the hooks chosen for it from here, and nothing else
of the process. The app (`proxy.app.Sidecar`) makes one at start; a call never reaches past it.

`CallHooks`: a call (`Call.run`) goes through the same phases whatever is on; a feature is an
object with a method per phase it cares about, given the call as a `CallView` (mitmproxy's
addons and their hooks named for the moment; Envoy AI Gateway's per-request translator and its
request-body / response-headers / response-body phases). The call holds a tuple of them, chosen
for it when it starts (`CallContext.hooks_for`); with none, no feature's code runs at all. Every
method of `CallHooks` is the phase's no-op, so a feature writes only the phases it needs.

The phases, in a call's order:

1. ``request_body``    the request is in: the body to send upstream (fields added, a prefix supplied).
2. ``upstream_request`` each time a request goes upstream: its headers.
3. ``upstream_head``   the upstream's head is in: the reply to relay (a refusal resent as the
   agent's own request); ``upstream_failed`` instead when no head came.
4. ``reply_relay``     before the body: the `ReplyRelay` the reply's bytes go through, when a
   feature rewrites them (the token capture mode cuts what it added; docs/tokens.md), else None.
5. ``before_reply_bytes`` a byte of the reply is about to reach the agent ahead of its line.
6. ``terminal``        the upstream exchange ended (last byte, error or cancel).
7. ``line_fields`` / ``line``  the capture line is built (on the loop or a thread): fields to add;
   ``line`` may write the line itself (the training-token entries before it).
8. ``reply_done``      the reply has been relayed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from capture.journal import Journal, RepeatLimiter

from ..http import Headers, ServerRequest, UpstreamPool, UpstreamReply
from ._metrics import SidecarMetrics
from ._retries import RetryMemory
from ._routing import Route

if TYPE_CHECKING:
    from capture.journal import Built

    from ._exchange import CallExchange
    from ._local_replies import LocalReply
    from ._reply_relay import ReplyRelay


class CallView(Protocol):
    """What a hook may read and do of the call it takes part in."""

    ctx: "CallContext"
    request: ServerRequest
    route: Route
    exchange: "Optional[CallExchange]"

    async def send_upstream(self, body: bytes) -> UpstreamReply:
        """Send the request upstream again, with ``body`` (the agent's own, after a refusal)."""

    def log_context(self) -> dict[str, object]:
        """The fields of a log line about this call."""


#: The phases a hook may take part in (`CallHooks`' methods), in a call's order.
PHASES = ("request_body", "upstream_request", "upstream_head", "upstream_failed", "reply_relay",
          "before_reply_bytes", "terminal", "line_fields", "line", "reply_done")


class CallHooks:
    """A feature's part in one call: override the phases it takes part in (all are no-ops here)."""

    __slots__ = ()

    #: The phases this class takes part in: those it overrides, found once per class. A call
    #: runs a phase only when one of its hooks takes part in it (`phases_of`): no no-op call, no
    #: coroutine made to return at once, on a captured call's way.
    phases: frozenset[str] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.phases = frozenset(phase for phase in PHASES if getattr(cls, phase) is not getattr(CallHooks, phase))

    #: The line's fields pass through `prepare_line` before the line goes to the journal: work that
    #: may take long (a redaction hook), done beside other lines' instead of in the journal's queue.
    prepares_line = False
    #: The part of the call's overhead this hook's line work is counted in (``line``, or its own:
    #: ``redaction``; docs/speed.md, "Overhead by part").
    overhead_part = "line"

    async def request_body(self, call: "CallView", body: bytes) -> bytes:
        return body

    def upstream_request(self, call: "CallView", headers: "Headers") -> "Headers":
        return headers

    async def upstream_head(self, call: "CallView", reply: "UpstreamReply") -> "UpstreamReply":
        return reply

    async def upstream_failed(self, call: "CallView") -> None:
        return None

    def reply_relay(self, call: "CallView", reply: "UpstreamReply") -> "Optional[ReplyRelay]":
        """The relay of the reply's bytes, when this feature rewrites them (None: as they came)."""
        return None

    async def before_reply_bytes(self, call: "CallView") -> None:
        return None

    def terminal(self, call: "CallView") -> None:
        return None

    def prepare_line(self, exchange: "CallExchange", make_fields: "Callable[[], dict[str, Any]]",
                     ready: "Callable[[Optional[dict[str, Any]]], None]") -> None:
        """(``prepares_line`` only; on the loop.) Make the fields (``make_fields``, on a thread of the
        feature's own), do this feature's `line_fields` work on them there, and hand them on with
        ``ready(fields)`` on the loop: then the line goes to the journal, and this feature's
        `line_fields` is not called again. ``ready(None)``: not prepared (making the fields failed):
        the journal builds the line as it would have."""
        ready(make_fields())

    def line_fields(self, exchange: "CallExchange", fields: dict[str, Any]) -> None:
        return None

    def line(self, exchange: "CallExchange", fields: dict[str, Any]) -> "Optional[Built]":
        return None

    def reply_done(self, call: "CallView") -> None:
        return None


#: The hooks of a call nothing takes part in.
NO_HOOKS: tuple[CallHooks, ...] = ()


def phases_of(hooks: tuple[CallHooks, ...]) -> frozenset[str]:
    """The phases any of ``hooks`` takes part in."""
    if len(hooks) == 1:
        return hooks[0].phases
    return frozenset().union(*(hook.phases for hook in hooks)) if hooks else frozenset()




@dataclass(eq=False)
class CallContext:
    """What every call of one sidecar shares."""

    upstream: UpstreamPool
    #: The upstream's URL, as the log and local replies name it.
    upstream_url: str
    metrics: SidecarMetrics
    #: Where lines go; None with capture off (no call is then captured).
    journal: Optional[Journal]
    #: Upstream failures and 413s repeat on every call while they last: said once per 10 s, with a count.
    warnings: RepeatLimiter
    retries: RetryMemory
    #: ``model_ref.name`` of every line, worked out once (it parses the upstream URL).
    model_ref_name: str
    max_body_bytes: int
    #: The session and assistant-message id header names (docs/wire.md correlation headers).
    correlation_headers: tuple[str, str]
    #: ``always`` or ``on-failure``: when a stream's ``response_raw`` goes on the line.
    raw_stream: str
    #: A W3C ``traceparent`` on every captured call's upstream request (unless the agent sent one).
    trace_context: bool
    drain_timeout: float
    #: The hooks of a captured call, chosen when it starts (`CallHooks`); the app sets it.
    hooks_for: Callable[[Route], tuple[CallHooks, ...]] = field(default=lambda route: NO_HOOKS)
    #: The hooks every captured line takes first, whatever made it (a bridged WebSocket turn too):
    #: redaction (docs/privacy.md); the app sets them.
    line_hooks: tuple[CallHooks, ...] = ()
    #: Before anything else, for a captured call: a local reply and its message when it must not
    #: go upstream (its rollout has ended: `proxy.app.features.RolloutEndsFeature`), else None. One call per
    #: captured call, not a hook: a hook takes part in every phase of the call.
    refusal: Callable[[Route], "Optional[tuple[LocalReply, str]]"] = field(default=lambda route: None)
    #: ``--forward``: ``all``, or ``model-api`` (other paths answered 404 here: `forwards`).
    forward: str = "all"
    #: The URL this sidecar listens on (for the words of a base_url hint).
    url: str = ""
    #: Set when the drain timeout cut calls still in flight: their lines say so.
    cut_by_drain: bool = False
    #: Captured calls under way, by rollout id (an end waits for its rollout's: docs/wire.md).
    rollouts_in_flight: dict[str, int] = field(default_factory=dict)
    #: A header sent upstream with each captured call, set to its rollout id (``--affinity-header``).
    affinity_header: Optional[bytes] = None
    #: The base_url mistakes already explained in the log (`base_url_mistake`).
    hinted: set[str] = field(default_factory=set)
    #: Whether the upstream adds a usage chunk to a chat or completions stream that did not ask
    #: for one (vLLM's ``--enable-force-include-usage``); None until a stream has shown it. Known
    #: no, such a stream's line is made at its last finish reason (docs/wire.md, "Durable before
    #: the agent's end"); known yes, at the usage chunk; not known, at ``[DONE]``.
    unasked_usage: Optional[bool] = None
