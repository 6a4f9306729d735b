"""One call's side of the token capture mode (DESIGN §11, §12), for the forwarder's `_Call`.

Before the call: the fields to add (`TokenMode.plan`), and the training-token plan -- the call's
lineage and intent (`TokenCapture.prepare`, on a worker thread). After the first reply: a refusal
or a compressed success sends the agent's own request instead. Then the cutter for the reply, and
a word when an event could not be cut. The forwarder calls each once; this holds the state.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Any, Optional

from capture import AddedFieldCutter, add_request_fields, parse_json_object

from ._entry_writer import TOKEN_DIALECTS
from ._renderer import SuppliedPrefix
from ._token_mode import REFUSAL_STATUSES, UpstreamBroke, WholeBody
from ..http._upstream import UpstreamReply

if TYPE_CHECKING:
    from ..call._call import _Call


class TokenCall:
    """The token capture mode's state for one call."""

    def __init__(self, call: "_Call") -> None:
        # A weak reference: the call holds this, and a cycle per call is left to the garbage
        # collector, whose passes over in-flight calls cost ~15% of a capturing call's CPU.
        self._call = weakref.ref(call)
        #: The fields added to this call's request, and the agent's own request parsed; None when
        #: nothing was added.
        self.fields: Optional[dict[str, Any]] = None
        self.agent_request: dict[str, Any] = {}
        self.cutter: Optional[AddedFieldCutter] = None
        #: The prompt ids supplied upstream (``--supply-prefix``), None when none were.
        self.prefix: Optional[SuppliedPrefix] = None
        #: `TokenCapture.prepare` under way (`plan_entry_soon`), None when not started or awaited.
        self._planning: Optional[asyncio.Future[Any]] = None

    @property
    def call(self) -> "_Call":
        call = self._call()
        assert call is not None, "a call's token state outlived the call"
        return call

    @property
    def on(self) -> bool:
        """The mode covers this call: --capture-tokens, or Gym's training path."""
        call = self.call
        return call.sidecar.token_mode is not None and (call.settings.capture_tokens or call.route.training_tokens)

    def request_body(self, body: bytes) -> bytes:
        """The body to send: the agent's own, or with the mode's fields added."""
        call, token_mode = self.call, self.call.sidecar.token_mode
        if token_mode is None or call.exchange is None or not self.on:
            return body
        plan = token_mode.plan(call.exchange.dialect, call.request.headers, body)
        if plan is None:
            return body
        self.fields, self.agent_request, sent = plan
        call.exchange.added_request_fields = self.fields
        call.exchange.parsed_request = self.agent_request
        return sent

    def plan_entry_soon(self) -> None:
        """Start `TokenCapture.prepare` on a worker thread beside the call's own work (a call it
        does not concern starts nothing); `planned` waits for it. Handed over at once, not from a
        task: the intent's flush is on the way to the agent's first byte (issue 34)."""
        exchange, token_capture = self.call.exchange, self.call.sidecar.token_capture
        if exchange is None or token_capture is None or not self.on or exchange.dialect not in TOKEN_DIALECTS:
            return
        request = self.agent_request or parse_json_object(self.call.request.body)
        if not request:
            return
        # A reply the agent asked for whole (no ``stream``) in the mode's JSON way reaches it only
        # after its capture line is durable: the intent's flush joins that barrier (one flush for
        # the call, not two; issue 34). Any other way out flushes first (`intent_durable`).
        flush_intent = self.fields is None or request.get("stream") is True
        self._planning = planning = asyncio.get_running_loop().run_in_executor(
            None, token_capture.prepare, exchange.rollout_id, exchange.model_call_id, exchange.dialect, request,
            exchange.retry_of, flush_intent)
        planning.add_done_callback(lambda done: _keep_plan(exchange, done))  # Also when nobody awaits it.

    async def planned(self) -> None:
        """The call's lineage and intent ready (`prepare`'s failures are its own: logged, counted,
        never the call's); the plan is the exchange's."""
        planning, self._planning = self._planning, None
        if planning is not None:
            await planning
            # Kept here too: awaiting a future already done goes on before its callbacks have run.
            _keep_plan(self.call.exchange, planning)

    async def intent_durable(self) -> None:
        """Before a byte of the reply reaches the agent ahead of its capture line: the intent on
        disk (DESIGN §12: durable before the agent gets a byte of the reply)."""
        exchange, token_capture = self.call.exchange, self.call.sidecar.token_capture
        plan = exchange.token_plan if exchange is not None else None
        if plan is not None and token_capture is not None and plan.intent_unflushed is not None:
            await asyncio.get_running_loop().run_in_executor(None, token_capture.flush_intent, plan)

    async def supply_prefix(self, body: bytes) -> bytes:
        """``body`` with the parent's exact prompt ids supplied (``--supply-prefix``), for a chat
        call whose lineage resolved a parent; else ``body`` (DESIGN §12, issue 32)."""
        call = self.call
        exchange, supply, token_mode = call.exchange, call.sidecar.prefix_supply, call.sidecar.token_mode
        if supply is None or token_mode is None or exchange is None or exchange.dialect != "chat" or not self.on:
            return body
        plan = exchange.token_plan
        if plan is None or not plan.verdict.resolved or not plan.verdict.parent_sequence:
            return body
        if "kv_transfer_params" in token_mode.refused:
            call.metrics.prefix_supply.labels("refused_before").inc()
            exchange.prefix_not_supplied = "refused_before"
            return body
        request = self.agent_request or parse_json_object(call.request.body) or {}
        prefix, why = await supply.prepare(call, request, plan.verdict.parent_call_id or "", plan.verdict.parent_sequence)
        sent = add_request_fields(body, {"kv_transfer_params": {"prompt_token_ids": prefix.prompt_token_ids}}) \
            if prefix is not None else None
        if prefix is None or sent is None:
            call.metrics.prefix_supply.labels(why or "body_not_an_object").inc()
            exchange.prefix_not_supplied = why or "body_not_an_object"
            return body
        self.prefix = exchange.supplied_prefix = prefix
        return sent

    def must_resend(self, upstream: UpstreamReply) -> bool:
        """Fields were added and the reply is a refusal (400, or FastAPI's 422: nothing was
        generated, maybe an added field refused) or a success the mode cannot cut (compressed):
        the agent gets the reply to its own request instead."""
        added = self.fields is not None or self.prefix is not None
        return added and (upstream.status in REFUSAL_STATUSES or _compressed_success(upstream))

    async def resend_own_request(self, upstream: UpstreamReply) -> UpstreamReply:
        """Send the agent's own request (DESIGN §11). A refusal the agent's own request does not
        get is learnt (those fields are not added again); a compressed reply is not a refusal: the
        mode stays on, this call goes without arrays, and the sidecar says so once."""
        call = self.call
        fields = {**(self.fields or {}), **({"kv_transfer_params": None} if self.prefix is not None else {})}
        refused = upstream.status in REFUSAL_STATUSES
        refused_body = b""
        if refused:
            sink = WholeBody()
            upstream.attach(sink)
            try:
                refused_body = await sink.done
            except UpstreamBroke as broke:
                refused_body = broke.partial
        upstream.close()  # A compressed stream closed mid-body: the model server stops generating.
        self.fields = self.prefix = None
        if call.exchange is not None:
            call.exchange.added_request_fields = None
            if call.exchange.supplied_prefix is not None:
                call.exchange.supplied_prefix = None
                call.exchange.prefix_not_supplied = "refused"
                call.metrics.prefix_supply.labels("refused").inc()
        own = await call._send_upstream(call.request.body)
        token_mode = call.sidecar.token_mode
        if token_mode is None:
            return own
        if not refused:
            call.metrics.token_mode_compressed.inc()
            token_mode.say_compressed(call.sidecar.upstream_url)
        elif 200 <= own.status < 300:
            token_mode.learn_refusal(fields, upstream.status, refused_body, call.sidecar.upstream_url)
            call.metrics.token_fields_refused.inc()
        return own

    def cutter_for(self, upstream: UpstreamReply) -> Optional[AddedFieldCutter]:
        """The cutter of a successful reply to a request with added fields, else None."""
        exchange = self.call.exchange
        if self.fields is None or not 200 <= upstream.status < 300 or exchange is None:
            return None
        self.cutter = AddedFieldCutter(exchange.dialect, self.fields, self.agent_request)
        return self.cutter

    def say_uncut(self) -> None:
        """Token data the cutter could not find in an event reached the agent: counted, said once a while."""
        if self.cutter is None or not self.cutter.uncut_events:
            return
        call, events = self.call, self.cutter.uncut_events
        call.metrics.token_mode_uncut_events.inc(events)
        call.sidecar.repeated_warnings.warning("uncut", "the token capture mode could not cut %d event(s) of a reply "
                                               "for %s: the agent received token data it did not ask for (counted in "
                                               "mcc_token_mode_uncut_events_total)", events,
                                               call.route.upstream_target, extra=call._log_context())


def _compressed_success(upstream: UpstreamReply) -> bool:
    encoding = upstream.header(b"content-encoding")
    return 200 <= upstream.status < 300 and encoding is not None and encoding.strip().lower() != b"identity"


def _keep_plan(exchange: Any, planning: "asyncio.Future[Any]") -> None:
    """The plan `TokenCapture.prepare` made, the exchange's (a call cancelled meanwhile too: its
    line names the entries it could not write)."""
    if not planning.cancelled() and planning.exception() is None:
        exchange.token_plan = planning.result()
