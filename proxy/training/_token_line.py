"""The line of a call in the token capture mode, and its training-token entries (docs/tokens.md).

On a writer thread (`TokenHooks.line_on_writer_thread`): the call's entries are written first,
from the arrays its reply carried, and made durable by the line's own barrier (the entries' file
and a pending intent are named with the line: both are on disk before the agent sees the end of
the reply, for one flush where there were two). Linear storage: the arrays then live once, in
the token file; the line keeps what the agent saw (the added fields cut, as they were from its
reply) and names the entries. An entry that cannot be written leaves the arrays in the line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

from capture import CuttingStreamTap
from capture.journal import AlsoDurable
from records.contract import encode_capture_line, token_records_of_line

from ._entry_writer import TokenCapture, TokenPlan, agent_view, cut_in_place, restore

if TYPE_CHECKING:
    from ..call import CallExchange


def token_line(token_capture: TokenCapture, plan: TokenPlan, exchange: "CallExchange", fields: dict[str, Any],
               prefix: Optional[bool]) -> Union[bytes, tuple[bytes, AlsoDurable]]:
    """The call's line, its entries written first; with the files its barrier must make durable
    when the intent is not flushed yet (`TokenPlan.intent_unflushed`)."""
    unsynced: list[str] = [plan.intent_unflushed] if plan.intent_unflushed is not None else []
    line = _line_and_entries(token_capture, plan, exchange, fields, prefix, unsynced)
    if not unsynced:
        return line
    return line, (unsynced, lambda exc: token_capture.not_durable(plan, exc))


def _line_and_entries(token_capture: TokenCapture, plan: TokenPlan, exchange: "CallExchange", fields: dict[str, Any],
                      prefix: Optional[bool], unsynced: list[str]) -> bytes:
    streamed = _streamed_line(token_capture, plan, exchange, fields, prefix, unsynced)
    if streamed is not None:
        return streamed
    keep_cut_logprobs(exchange, fields)
    line = encode_capture_line(fields)
    parsed = token_capture.commit(plan, line, prefix, unsynced)
    if parsed is None:
        return line  # No entry holds the arrays: the line keeps them.
    seen = agent_view(exchange, parsed.get("response"))
    if seen is None:
        # The reply's routed experts, stored apart, are named by reference (`TokenCapture._store_routed_experts`).
        return encode_capture_line(parsed) if plan.experts_stored else line
    parsed["response"] = seen
    parsed["token_entries"] = list(plan.entry_ids)
    return encode_capture_line(parsed)


def _streamed_line(token_capture: TokenCapture, plan: TokenPlan, exchange: "CallExchange", fields: dict[str, Any],
                   prefix: Optional[bool], unsynced: Optional[list[str]] = None) -> bytes | None:
    """A chat stream in the token capture mode: the entries from the ids and logprobs the tap
    kept as they streamed, and the line of what the agent saw, without ever writing the
    arrays into a line and parsing them back (the tap's logprob entries are most of the
    bytes); None to take the general way (another dialect, another shape, an entry not written)."""
    tap, response = exchange.tap, fields.get("response")
    collected = tap.collected_arrays() if isinstance(tap, CuttingStreamTap) else None
    if not collected or not isinstance(response, dict) or not exchange.added_request_fields:
        return None
    prompt = response.get("prompt_token_ids")
    replaced = cut_in_place(exchange, response)
    records = []
    for record in token_records_of_line(fields, exchange.rollout_id, 0):
        ids, logprobs = collected.get(record.choice_index, (None, None))
        if type(prompt) is not list or ids is None or logprobs is None or len(ids) != len(logprobs):
            restore(replaced)
            _put_back_logprobs(response, collected)
            return None
        records.append(record.model_copy(update={"prompt_token_ids": prompt, "generation_token_ids": ids,
                                                 "generation_log_probs": logprobs, "missing": (), "problem": None}))
    if not token_capture.commit_records(plan, records, response, prefix, unsynced):
        restore(replaced)  # Not every choice has its entry: the line keeps the arrays (never tried twice).
        _put_back_logprobs(response, collected)
        return encode_capture_line(fields)
    fields["token_entries"] = list(plan.entry_ids)
    return encode_capture_line(fields)


def keep_cut_logprobs(exchange: "CallExchange", fields: dict[str, Any]) -> None:
    """A stream whose logprobs the cutter cut kept floats, not entries, in its fold: the line
    gets them back (`_put_back_logprobs`)."""
    tap = exchange.tap
    if isinstance(tap, CuttingStreamTap) and tap.cutter.cuts_logprobs \
            and isinstance(fields.get("response"), dict):
        _put_back_logprobs(fields["response"], tap.collected_arrays() or {})


def _put_back_logprobs(response: dict[str, Any], collected: dict[int, Any]) -> None:
    """The line keeps the arrays after all (an entry was not written): logprobs whose entries the
    stream's fold did not keep (`ChatReassembler.keep_logprob_entries`) go back as ``{"logprob"}``
    entries -- what a trainer reads of them -- so nothing is lost."""
    for choice in response.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        logprobs = choice.get("logprobs")
        index = choice.get("index")
        floats = collected.get(index, (None, None))[1] if type(index) is int else None
        if floats is not None and isinstance(logprobs, dict) and logprobs.get("content") is None:
            choice["logprobs"] = {**logprobs, "content": [{"logprob": value} for value in floats]}


def note_resumption(plan: TokenPlan, fields: dict[str, Any]) -> None:
    """``resumes``: this call continues an aborted one -- its parent ended ``abort`` and the prompt
    the upstream reports is that call's prompt + partial generation, exactly (issue 32)."""
    if not plan.verdict.parent_aborted:
        return
    response = fields.get("response")
    prompt = response.get("prompt_token_ids") if isinstance(response, dict) else None
    choices = response.get("choices") if isinstance(response, dict) else None
    if prompt is None and isinstance(choices, list) and choices and isinstance(choices[0], dict):
        prompt = choices[0].get("prompt_token_ids")  # Completions: on the choice.
    request = fields.get("request")
    if prompt is None and fields.get("dialect") == "generate" and isinstance(request, dict):
        prompt = request.get("token_ids")  # Token-in: the request's own ids.
    if prompt == plan.verdict.parent_sequence:
        fields["resumes"] = plan.verdict.parent_call_id
