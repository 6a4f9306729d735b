"""One model call (docs/layout.md, docs/wire.md): its phases, the body pump, the exchange and its line.

A call reads what it may use from a `CallContext`; features take part through the `CallHooks`
chosen for it, at named phases; this package names no feature. Below it only the wire
(`proxy.http`), `capture` and `records`.
"""

from ._call import Call, forward, origin_form
from ._context import NO_HOOKS, PHASES, CallContext, CallHooks, CallView, phases_of
from ._exchange import MODEL_REF_TYPE, CallExchange, Failure, new_call_id
from ._line import build_line, submit_line
from ._forwarded_paths import FORWARD_MODES, forwards
from ._local_replies import NOT_FORWARDED, ROLLOUT_ENDED, UPSTREAM_TIMEOUT, UPSTREAM_UNREACHABLE, LocalReply, send_local_reply
from ._metrics import CONTENT_TYPE, SidecarMetrics, directory_writable, status_class
from ._pump import BodyPump
from ._reply_relay import AS_CAME, ReplyRelay
from ._retries import RetryMemory
from ._routing import OBSERVED_PATHS, Route, base_url_mistake, route_request

__all__ = [
    "FORWARD_MODES",
    "NOT_FORWARDED",
    "forwards",
    "AS_CAME",
    "BodyPump",
    "CONTENT_TYPE",
    "Call",
    "CallContext",
    "CallExchange",
    "CallHooks",
    "CallView",
    "Failure",
    "LocalReply",
    "MODEL_REF_TYPE",
    "NO_HOOKS",
    "OBSERVED_PATHS",
    "PHASES",
    "ROLLOUT_ENDED",
    "ReplyRelay",
    "RetryMemory",
    "Route",
    "SidecarMetrics",
    "UPSTREAM_TIMEOUT",
    "UPSTREAM_UNREACHABLE",
    "base_url_mistake",
    "build_line",
    "directory_writable",
    "forward",
    "new_call_id",
    "origin_form",
    "phases_of",
    "route_request",
    "send_local_reply",
    "status_class",
    "submit_line",
]
