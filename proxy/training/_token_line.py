"""The line of a call in the token capture mode, and its training-token entries (docs/tokens.md).

Built where the line is appended (`token_line_job`: a `capture.journal.Job`, run in the capture
process, or on a writer thread where there is none): the call's entries are written first, from
the arrays its reply carried, and made durable by the line's own barrier (the entries' file and a
pending intent are named with the line: both are on disk before the agent sees the end of the
reply, for one flush where there were two). Linear storage: the arrays then live once, in the
token file; the line keeps what the agent saw (the added fields cut, as they were from its reply)
and names the entries. An entry that cannot be written leaves the arrays in the line.

The job runs outside the sidecar's interpreter (issue 76: an entry's encoding, digest and locked
append took the lock the event loop relays every call's bytes with), so it gets what it needs of
the call as a `LineView`, and gives back what the sidecar keeps as notes (`TokenCapture.take_notes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import orjson

from capture import CollectedArrays, CuttingStreamTap
from capture.journal import Job, JobLine
from records.contract import encode_capture_line, token_records_of_line

from ._entry_writer import EntryWriter, TokenCapture, TokenPlan, agent_view, cut_in_place, files_of, restore

if TYPE_CHECKING:
    from ..call import CallExchange

#: The job's function, as the capture process imports it.
_WRITE_TOKEN_LINE = "proxy.training._token_line:write_token_line"


@dataclass
class LineView:
    """What building a token-mode line reads of its call (picklable: it travels with the job)."""

    rollout_id: str
    dialect: str
    added_request_fields: Optional[dict[str, Any]]
    parsed_request: Optional[dict[str, Any]]
    #: Each choice's ids and logprobs as they streamed (`CuttingStreamTap.collected`), compact.
    collected: Optional[CollectedArrays]
    #: The stream's fold kept floats, not entries, for the logprobs it cut (`keep_cut_logprobs`).
    cuts_logprobs: bool

    @classmethod
    def of(cls, exchange: "CallExchange") -> "LineView":
        tap = exchange.tap
        cutting = isinstance(tap, CuttingStreamTap)
        return cls(exchange.rollout_id, exchange.dialect, exchange.added_request_fields, exchange.parsed_request,
                   tap.collected() if cutting else None,  # type: ignore[union-attr]  # a cutting tap here
                   cutting and tap.cutter.cuts_logprobs)  # type: ignore[union-attr]  # a cutting tap here

    def arrays(self) -> Optional[dict[int, tuple[Optional[list[int]], Optional[list[float]]]]]:
        """`collected`, parsed."""
        return self.collected.lists() if self.collected is not None else None


def token_line_job(token_capture: TokenCapture, plan: TokenPlan, exchange: "CallExchange", fields: dict[str, Any],
                   prefix: Optional[bool]) -> Job:
    """The call's line, as a job: its entries written first (`write_token_line`), its notes to
    ``token_capture`` before the line settles."""
    _compact_prompt(fields)
    return Job(_WRITE_TOKEN_LINE, (token_capture.files.directory, token_capture.routed_experts, plan,
                                   LineView.of(exchange), fields, prefix), token_capture.take_notes)


def write_token_line(directory: str, routed_experts: bool, plan: TokenPlan, view: LineView, fields: dict[str, Any],
                     prefix: Optional[bool]) -> JobLine:
    """The job: the entries, then the line; the files its barrier must make durable when the
    intent is not flushed yet (`TokenPlan.intent_unflushed`)."""
    _parsed_prompt(fields)
    writer = EntryWriter(files_of(directory), routed_experts)
    unsynced: list[str] = [plan.intent_unflushed] if plan.intent_unflushed is not None else []
    line = _line_and_entries(writer, plan, view, fields, prefix, unsynced)
    return JobLine(line, unsynced, lambda exc: writer.failed(plan, exc), lambda: writer.notes)


#: A reply's prompt ids longer than this travel to the job as their JSON (`_compact_prompt`).
_COMPACT_PROMPT = 64


def _compact_prompt(fields: dict[str, Any]) -> None:
    """A chat stream's prompt ids (thousands) as their JSON, for the job's pickle: one C call, where
    pickle takes 19 ns an int on the event loop (`_parsed_prompt` gives them back, in their place)."""
    response = fields.get("response")
    prompt = response.get("prompt_token_ids") if isinstance(response, dict) else None
    if type(prompt) is list and len(prompt) > _COMPACT_PROMPT:
        try:
            response["prompt_token_ids"] = orjson.Fragment(orjson.dumps(prompt))  # type: ignore[index]  # a dict: read above
        except TypeError:  # An id orjson cannot write (past 64 bits): it goes as it is.
            pass


def _parsed_prompt(fields: dict[str, Any]) -> None:
    response = fields.get("response")
    prompt = response.get("prompt_token_ids") if isinstance(response, dict) else None
    if type(prompt) is orjson.Fragment:
        response["prompt_token_ids"] = orjson.loads(orjson.dumps(prompt))  # type: ignore[index]  # a dict: read above


def _line_and_entries(writer: EntryWriter, plan: TokenPlan, view: LineView, fields: dict[str, Any],
                      prefix: Optional[bool], unsynced: list[str]) -> bytes:
    streamed = _streamed_line(writer, plan, view, fields, prefix, unsynced)
    if streamed is not None:
        return streamed
    _keep_cut_logprobs(view, fields)
    line = encode_capture_line(fields)
    parsed = writer.commit(plan, line, prefix, unsynced)
    if parsed is None:
        return line  # No entry holds the arrays: the line keeps them.
    seen = agent_view(view, parsed.get("response"))
    if seen is None:
        # The reply's routed experts, stored apart, are named by reference (`EntryWriter._store_routed_experts`).
        return encode_capture_line(parsed) if plan.experts_stored else line
    parsed["response"] = seen
    parsed["token_entries"] = list(plan.entry_ids)
    return encode_capture_line(parsed)


def _streamed_line(writer: EntryWriter, plan: TokenPlan, view: LineView, fields: dict[str, Any],
                   prefix: Optional[bool], unsynced: Optional[list[str]] = None) -> bytes | None:
    """A chat stream in the token capture mode: the entries from the ids and logprobs the tap
    kept as they streamed, and the line of what the agent saw, without ever writing the
    arrays into a line and parsing them back (the tap's logprob entries are most of the
    bytes); None to take the general way (another dialect, another shape, an entry not written)."""
    collected, response = view.arrays(), fields.get("response")
    if not collected or not isinstance(response, dict) or not view.added_request_fields:
        return None
    prompt = response.get("prompt_token_ids")
    replaced = cut_in_place(view, response)
    records = []
    for record in token_records_of_line(fields, view.rollout_id, 0):
        ids, logprobs = collected.get(record.choice_index, (None, None))
        if type(prompt) is not list or ids is None or logprobs is None or len(ids) != len(logprobs):
            restore(replaced)
            _put_back_logprobs(response, collected)
            return None
        records.append(record.model_copy(update={"prompt_token_ids": prompt, "generation_token_ids": ids,
                                                 "generation_log_probs": logprobs, "missing": (), "problem": None}))
    if not writer.commit_records(plan, records, response, prefix, unsynced):
        restore(replaced)  # Not every choice has its entry: the line keeps the arrays (never tried twice).
        _put_back_logprobs(response, collected)
        return encode_capture_line(fields)
    fields["token_entries"] = list(plan.entry_ids)
    return encode_capture_line(fields)


def keep_cut_logprobs(exchange: "CallExchange", fields: dict[str, Any]) -> None:
    """A stream whose logprobs the cutter cut kept floats, not entries, in its fold: the line
    gets them back (`_put_back_logprobs`)."""
    tap = exchange.tap
    if isinstance(tap, CuttingStreamTap) and tap.cutter.cuts_logprobs:
        _keep_cut_logprobs(LineView.of(exchange), fields)


def _keep_cut_logprobs(view: LineView, fields: dict[str, Any]) -> None:
    if view.cuts_logprobs and isinstance(fields.get("response"), dict):
        _put_back_logprobs(fields["response"], view.arrays() or {})


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
