"""The token capture mode in a call (docs/tokens.md): `TokenHooks`, one per call it covers.

At the call's phases (`proxy.call.CallHooks`):

- request body: the fields to add (`TokenMode.plan`), the training-token plan started on a worker
  thread (the call's lineage and intent: `TokenCapture.prepare`), the parent's prompt supplied
  (``--supply-prefix``);
- upstream request: the rollout's session affinity header;
- upstream head: a refusal, or a compressed success, sends the agent's own request instead; the
  plan awaited;
- reply relay: a successful reply cut of the added fields (`CutRelay`, its `AddedFieldCutter`);
- before reply bytes: the intent durable;
- line: prefix supply's proof and a resumption named; the entries written before the line, and the
  line of what the agent saw, where the line is appended (a job: `_token_line`);
- reply done: a word when an event could not be cut.

`TokenTraining` is the process's side: the mode's memory of refusals, the token files, the
renderer; it makes a call's hooks (`hooks`) when the mode covers it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Optional

from capture import (
    AddedFieldCutter, add_request_fields, decodable, make_decoder, parse_json_object, proves_prefix, reported_prompt_ids,
    responses_render_request,
)

from ..call import CallHooks
from ..http import Headers, UpstreamBroke, UpstreamReply, WholeBody
from ._cut_relay import CutRelay
from ._entry_writer import TOKEN_DIALECTS, TokenCapture, TokenPlan
from ._renderer import PrefixSupply, SuppliedPrefix
from ._token_line import keep_cut_logprobs, note_resumption, token_line_job
from ._token_mode import REFUSAL_STATUSES, TokenMode

if TYPE_CHECKING:
    from capture.journal import Built

    from ._side_calls import SideCalls

    from ..call import CallExchange, CallView

    from ._metrics import TokenModeMetrics


class TokenTraining:
    """The token capture mode of one sidecar: what every call it covers shares."""

    def __init__(self, metrics: "TokenModeMetrics", token_capture: TokenCapture, every_call: bool,
                 prefix_supply: Optional[PrefixSupply] = None, side_calls: Optional["SideCalls"] = None) -> None:
        self.metrics = metrics
        self.mode = TokenMode()
        self.token_capture = token_capture
        #: --capture-tokens: every call; else only Gym's training path (``Route.training_tokens``).
        self.every_call = every_call
        #: --supply-prefix (docs/tokens.md): the renderer round trips and what they taught.
        self.prefix_supply = prefix_supply
        #: Side calls take no part: no fields added, no intent, no entry (`proxy.training._side_calls`).
        self.side_calls = side_calls

    def covers(self, training_path: bool) -> bool:
        return self.every_call or training_path

    def hooks(self) -> "TokenHooks":
        return TokenHooks(self)


class TokenHooks(CallHooks):
    """The token capture mode's state for one call."""

    __slots__ = ("training", "fields", "agent_request", "cutter", "prefix", "plan", "_planning", "prefix_proof",
                 "prefix_not_supplied", "sent_identity", "_flushing", "_flush_before_reply")

    def __init__(self, training: TokenTraining) -> None:
        self.training = training
        #: The fields added to this call's request, and the agent's own request parsed; None when
        #: nothing was added.
        self.fields: Optional[dict[str, Any]] = None
        self.agent_request: dict[str, Any] = {}
        self.cutter: Optional[AddedFieldCutter] = None
        #: The prompt ids supplied upstream (``--supply-prefix``), None when none were.
        self.prefix: Optional[SuppliedPrefix] = None
        #: Why a call with a resolved parent went without a supplied prefix.
        self.prefix_not_supplied: Optional[str] = None
        #: Whether the upstream's prompt began with the prefix supplied (set when the line is built).
        self.prefix_proof: Optional[bool] = None
        #: What `TokenCapture.prepare` decided: the call's lineage and its entries.
        self.plan: Optional[TokenPlan] = None
        #: `TokenCapture.prepare` under way, None when not started or awaited.
        self._planning: Optional[asyncio.Future[Any]] = None
        #: The agent's body came compressed and was decoded to add the fields: it goes identity-encoded.
        self.sent_identity = False
        #: The intent's flush, begun once the plan is in (`_keep_plan`), None until then.
        self._flushing: Optional[asyncio.Future[None]] = None
        #: The reply may reach the agent before its capture line: the intent is flushed on its own,
        #: as soon as it is written (`_plan_entry_soon`), not with the line.
        self._flush_before_reply = False

    # -- phase: request body ---------------------------------------------------------------------

    async def request_body(self, call: "CallView", body: bytes) -> bytes:
        if self._side_call(call):
            return body  # Never trained on: the agent's request goes as it came, and no entry is written.
        body = self._add_fields(call, body)
        # The call's lineage and its intent (docs/tokens.md) are prepared while the request goes
        # upstream, and awaited before the agent gets a byte of the reply (issue 34); prefix
        # supply needs the lineage before the request.
        self._plan_entry_soon(call)
        if self.training.prefix_supply is not None:
            await self._planned()
            body = await self._supply_prefix(call, body)
        return body

    def _side_call(self, call: "CallView") -> bool:
        """Whether the call is a side call (decided here, before it is dispatched: its intent would be)."""
        exchange, rule = call.exchange, self.training.side_calls
        if rule is None or exchange is None:
            return False
        if exchange.side_call is None:
            request = parse_json_object(call.request.body) if not call.request.fields.get(b"content-encoding") else None
            if request:
                exchange.parsed_request = request  # Parsed once: the fields' plan and the line read it.
            exchange.side_call = (rule.reason(exchange.rollout_id, request) if request else None) or ""
        return bool(exchange.side_call)

    def _add_fields(self, call: "CallView", body: bytes) -> bytes:
        """The body to send: the agent's own, or with the mode's fields added. A compressed body
        (Codex CLI compresses with zstd) is decoded, the fields added, and sent identity-encoded
        (`upstream_request` drops its Content-Encoding); the agent's own bytes are what a refusal
        or an uncuttable reply resends."""
        exchange, own = call.exchange, body
        headers = call.request.headers
        coding = call.request.fields.get(b"content-encoding")
        if coding is not None and coding.strip().lower() not in (b"", b"identity"):
            encoding = coding.decode("latin-1")
            if not decodable(encoding):
                return own
            try:
                body = make_decoder(encoding)(body)
            except Exception:  # Corrupt or too large: the agent's own request goes as it came.
                return own
            headers = [(name, value) for name, value in headers if name.lower() != b"content-encoding"]
            # The lineage reads it (`_plan_entry_soon`), and the line: decoded once, here.
            self.agent_request = parse_json_object(body) or {}
            if self.agent_request:
                exchange.parsed_request = self.agent_request  # type: ignore[union-attr]  # the call has an exchange in this phase
        parsed = exchange.parsed_request if exchange is not None else None  # (The side-call check's parse.)
        plan = self.training.mode.plan(exchange.dialect, headers, body, parsed)  # type: ignore[union-attr]  # token mode is on in this hook
        if plan is None:
            return own
        self.sent_identity = coding is not None
        self.fields, self.agent_request, sent = plan
        exchange.added_request_fields = self.fields  # type: ignore[union-attr]  # the call has an exchange in this phase
        exchange.parsed_request = self.agent_request  # type: ignore[union-attr]  # the call has an exchange in this phase
        return sent

    def _plan_entry_soon(self, call: "CallView") -> None:
        """Start `TokenCapture.prepare` on a worker thread beside the call's own work. Handed over
        at once, not from a task: the intent's flush is on the way to the agent's first byte."""
        exchange = call.exchange
        if exchange is None or exchange.dialect not in TOKEN_DIALECTS:
            return
        request = self.agent_request or parse_json_object(call.request.body)
        if not request:
            return
        # A reply the agent asked for whole (no ``stream``) in the mode's JSON way reaches it only
        # after its capture line is durable: the intent's flush joins that barrier (one flush for
        # the call, not two; issue 34). Any other way out flushes it as soon as it is written,
        # while the request goes upstream, and waits for it before the first byte (`before_reply_bytes`).
        self._flush_before_reply = self.fields is None or request.get("stream") is True
        exchange.note_json_retry(request)  # Parsed here first: a resend's token entry names its call too.
        self._planning = planning = asyncio.get_running_loop().run_in_executor(
            None, self.training.token_capture.prepare, exchange.rollout_id, exchange.model_call_id,
            exchange.dialect, request, exchange.retry_of)
        planning.add_done_callback(self._keep_plan)  # Also when nobody awaits it.

    def _keep_plan(self, planning: "asyncio.Future[Any]") -> None:
        """The plan `prepare` made (a call cancelled meanwhile too: its line names the entries it
        could not write), and its intent's flush begun when the reply may reach the agent before
        its line. The flush holds no thread (`TokenCapture.flush_intent_soon`)."""
        if planning.cancelled() or planning.exception() is not None:
            return
        self.plan = planning.result()
        if self._flush_before_reply and self._flushing is None:
            self._flush_intent()

    def _flush_intent(self) -> None:
        """Begin the plan's intent's flush, when it is written and not flushed yet."""
        plan = self.plan
        if plan is not None and plan.intent_unflushed is not None:
            self._flushing = self.training.token_capture.flush_intent_soon(plan)

    async def _planned(self) -> None:
        """The call's lineage and intent ready (`prepare`'s failures are its own: logged, counted,
        never the call's)."""
        planning, self._planning = self._planning, None
        if planning is not None:
            await planning
            self._keep_plan(planning)  # Awaiting a future already done goes on before its callbacks.

    async def _supply_prefix(self, call: "CallView", body: bytes) -> bytes:
        """``body`` with the parent's exact prompt ids supplied (``--supply-prefix``), for a chat
        call whose lineage resolved a parent; else ``body`` (docs/tokens.md, issue 32)."""
        exchange, supply, metrics = call.exchange, self.training.prefix_supply, self.training.metrics
        plan = self.plan
        if exchange is None or supply is None or exchange.dialect not in ("chat", "responses") or plan is None \
                or not plan.verdict.resolved or not plan.verdict.parent_sequence:
            return body
        if "kv_transfer_params" in self.training.mode.refused:
            metrics.prefix_supply.labels("refused_before").inc()
            self.prefix_not_supplied = "refused_before"
            return body
        request = self.agent_request or parse_json_object(call.request.body) or {}
        if exchange.dialect == "responses":  # Rendered as the chat messages vLLM builds from its items.
            request = responses_render_request(request) or {}
            if not request:
                metrics.prefix_supply.labels("responses_items_not_plain").inc()
                self.prefix_not_supplied = "responses_items_not_plain"
                return body
        prefix, why = await supply.prepare(call, request, plan.verdict.parent_call_id or "", plan.verdict.parent_sequence)
        sent = add_request_fields(body, {"kv_transfer_params": {"prompt_token_ids": prefix.prompt_token_ids}}) \
            if prefix is not None else None
        if prefix is None or sent is None:
            metrics.prefix_supply.labels(why or "body_not_an_object").inc()
            self.prefix_not_supplied = why or "body_not_an_object"
            return body
        self.prefix = prefix
        return sent

    # -- phases: upstream request, upstream head ---------------------------------------------------

    def upstream_request(self, call: "CallView", headers: Headers) -> Headers:
        """``X-Session-ID: <rollout_id>`` (issue 32): vLLM 0.33 routes and caches a session's calls
        together by it; other servers ignore it. An agent's own header is kept. A body the mode
        decoded to add its fields goes identity-encoded (`_add_fields`)."""
        if self.sent_identity and (self.fields is not None or self.prefix is not None):
            headers = [(name, value) for name, value in headers if name.lower() != b"content-encoding"]
        rollout_id = call.exchange.rollout_id if call.exchange is not None else ""
        if not rollout_id or any(name.lower() == b"x-session-id" for name, _ in headers):
            return headers
        return [*headers, (b"X-Session-ID", rollout_id.encode("latin-1", "replace"))]

    async def upstream_head(self, call: "CallView", reply: UpstreamReply) -> UpstreamReply:
        if self._must_resend(reply):
            reply = await self._resend_own_request(call, reply)
        await self._planned()
        return reply

    async def upstream_failed(self, call: "CallView") -> None:
        await self._planned()

    def _must_resend(self, upstream: UpstreamReply) -> bool:
        """Fields were added and the reply is a refusal (400, or FastAPI's 422: nothing was
        generated, maybe an added field refused) or a success the mode cannot cut (compressed)."""
        added = self.fields is not None or self.prefix is not None
        return added and (upstream.status in REFUSAL_STATUSES or _compressed_success(upstream))

    async def _resend_own_request(self, call: "CallView", upstream: UpstreamReply) -> UpstreamReply:
        """Send the agent's own request (docs/tokens.md). A refusal the agent's own request does not
        get is learnt (those fields are not added again); a compressed reply is not a refusal: the
        mode stays on, this call goes without arrays, and the sidecar says so once."""
        training, metrics = self.training, self.training.metrics
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
        supplied = self.prefix is not None
        self.fields = self.prefix = None
        if call.exchange is not None:
            call.exchange.added_request_fields = None
        if supplied:
            self.prefix_not_supplied = "refused"
            metrics.prefix_supply.labels("refused").inc()
        own = await call.send_upstream(call.request.body)
        upstream_url = call.ctx.upstream_url
        if not refused:
            metrics.token_mode_compressed.inc()
            training.mode.say_compressed(upstream_url)
        elif 200 <= own.status < 300:
            training.mode.learn_refusal(fields, upstream.status, refused_body, upstream_url)
            metrics.token_fields_refused.inc()
        return own

    # -- phases: the reply -------------------------------------------------------------------------

    def reply_relay(self, call: "CallView", reply: UpstreamReply) -> Optional[CutRelay]:
        """A successful reply to a request with added fields goes to the agent with them cut."""
        if self.fields is None or not 200 <= reply.status < 300 or call.exchange is None:
            return None
        self.cutter = AddedFieldCutter(call.exchange.dialect, self.fields, self.agent_request)
        return CutRelay(self.cutter)

    async def before_reply_bytes(self, call: "CallView") -> None:
        """Before a byte of the reply reaches the agent ahead of its capture line: the intent on
        disk (docs/tokens.md: durable before the agent gets a byte of the reply)."""
        if self._flushing is None:  # Not begun: the JSON way's, whose line was to cover it.
            self._flush_intent()
        if self._flushing is not None:
            await self._flushing

    def reply_done(self, call: "CallView") -> None:
        """Token data the cutter could not find in an event reached the agent: counted, said once a while."""
        if self.cutter is None or not self.cutter.uncut_events:
            return
        events = self.cutter.uncut_events
        self.training.metrics.token_mode_uncut_events.inc(events)
        call.ctx.warnings.warning("uncut", "the token capture mode could not cut %d event(s) of a reply for %s: the "
                                  "agent received token data it did not ask for (counted in "
                                  "mcc_token_mode_uncut_events_total)", events, call.route.upstream_target,
                                  extra=call.log_context())

    # -- phase: line ------------------------------------------------------------------------------

    def line_fields(self, exchange: "CallExchange", fields: dict[str, Any]) -> None:
        """Prefix supply's proof (docs/tokens.md): the prompt ids the upstream reports begin with the
        ids supplied, as ``prefix_supplied``, or ``prefix_not_supplied``: why a call with a
        resolved parent went without. ``resumes``: the aborted call this one continues."""
        supplied = self.prefix
        if supplied is None:
            if self.prefix_not_supplied is not None:
                fields["prefix_not_supplied"] = self.prefix_not_supplied
        else:
            response = fields.get("response")
            proved = proves_prefix(reported_prompt_ids(response), supplied.prompt_token_ids)
            fields["prefix_supplied"] = self.prefix_proof = proved
            self.training.metrics.prefix_supply.labels("proved" if proved else "unproved").inc()
        if self.plan is not None:
            note_resumption(self.plan, fields)

    def line(self, exchange: "CallExchange", fields: dict[str, Any]) -> "Optional[Built]":
        if self.plan is None:
            keep_cut_logprobs(exchange, fields)
            return None
        # Its entries are written first, where the line is appended (the capture process): a job.
        return token_line_job(self.training.token_capture, self.plan, exchange, fields, self.prefix_proof)


def _compressed_success(upstream: UpstreamReply) -> bool:
    encoding = upstream.header(b"content-encoding")
    return 200 <= upstream.status < 300 and encoding is not None and encoding.strip().lower() != b"identity"
