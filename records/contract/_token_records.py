"""Training arrays from captured calls: `read_token_records` (docs/reading.md, issue 13).

RL trainers need, per generation, the exact prompt token ids, the generated token ids and their
log probabilities. The sidecar keeps whatever the model server returned (streams are rebuilt
with vLLM's per-chunk ``token_ids`` and ``logprobs`` concatenated), and this module reads the
arrays back, one `TokenRecord` per call and choice, with the field names of NeMo Gym 0.7.0's
``TokenEntry`` (``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``) so its
users recognise them.

Where the arrays come from, first match wins (the order of Gym's vLLM adapter, plus vLLM's own
``return_token_ids`` fields, which Gym does not read):

1. ``message``: the choice's message (or a Responses output item) carries
   ``generation_token_ids`` and ``generation_log_probs`` -- the shape NeMo RL's vLLM worker writes.
2. ``vllm``: the choice's ``token_ids`` (vLLM ``return_token_ids``), log probabilities from
   ``logprobs.content[*].logprob``.
3. ``logprob_tokens``: ``logprobs.content[*].token`` of the form ``token_id:N`` (vLLM
   ``return_tokens_as_token_ids``) with their ``logprob``.

The prompt comes from the message's ``prompt_token_ids``, else the response's top-level one
(vLLM). Nothing is padded, truncated or guessed: an array that is absent is named in
``missing``; arrays that disagree (lengths, or ``token_ids`` against ``token_id:N`` tokens) are
kept as found and described in ``problem``. Unlike Gym, which raises on the first such call,
every call gets its record and the caller decides (`TokenRecord.usable`).

Other dialects (issue 20): Responses from vLLM with ``enable_response_messages`` carry the prompt
ids in ``input_messages[*].tokens`` and the generated ids in ``output_messages[*].tokens``, with
log probabilities on the ``output_text`` parts (source ``vllm``); completions carry
``prompt_token_ids`` and ``token_ids`` per choice and ``logprobs.token_logprobs``.

A generation the agent did not see whole (cancelled, cut, errored, no finish reason) is never
usable, whatever arrays it has: `TokenRecord.unusable_reason` says why.

Multi-turn drift: a trainer that concatenates a rollout's turns relies on each prompt beginning
with an earlier call's prompt + generation ids. `iter_token_records` compares each prompt with
every earlier sequence of the rollout: ``extends`` names the latest call it begins with,
``drift_at`` the token where it departs from the closest one (chat templates that drop
reasoning or re-render tool calls break the prefix).
"""

from __future__ import annotations

from itertools import repeat
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict

from ._weight_versions import resolved_spans, token_versions

#: Where the generation arrays were found (see the module docstring); ``missing`` when nowhere.
TOKEN_SOURCES = ("message", "vllm", "logprob_tokens", "token_file", "missing")
_ARRAYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
_TOKEN_ID_PREFIX = "token_id:"
#: Categories of a call whose reply the agent still received whole (a Responses call capped by
#: ``max_output_tokens`` ends ``incomplete``, as a chat call ends with ``finish_reason: length``).
_SEEN_WHOLE_CATEGORIES = frozenset({"incomplete"})
#: Finish reasons (and Responses statuses) of a generation that never ended.
_UNFINISHED_REASONS = frozenset({"abort", "in_progress", "queued", "failed", "cancelled"})


class TokenRecord(BaseModel):
    """One call's (and one choice's) training arrays, as the captured response carried them."""

    model_config = ConfigDict(frozen=True)

    rollout_id: str
    model_call_id: Optional[str] = None
    call_index: int
    choice_index: int = 0
    model: Optional[str] = None
    prompt_token_ids: Optional[list[int]] = None
    generation_token_ids: Optional[list[int]] = None
    generation_log_probs: Optional[list[float]] = None
    finish_reason: Optional[str] = None
    #: The call's ``error_category`` (``stream_truncated``: the arrays stop where the stream was cut).
    error_category: Optional[str] = None
    #: ``message``, ``vllm``, ``sglang``, ``logprob_tokens`` or ``missing``: where the generation arrays came from.
    source: str = "missing"
    #: The arrays that were not found, among prompt_token_ids, generation_token_ids, generation_log_probs.
    missing: tuple[str, ...] = ()
    #: Why the arrays cannot be trusted as they are (lengths disagree, a value is not a number), or None.
    problem: Optional[str] = None
    #: The ``call_index`` of the latest earlier call of the rollout whose prompt + generation ids
    #: this prompt begins with (a trainer may concatenate the two), or None.
    extends: Optional[int] = None
    #: Where this prompt departs from the prompt + generation ids of the call its request claims to
    #: continue (the index of the first token that differs), or None: it extends it, or it continues
    #: nothing (a root call is never drift). A request that matches no earlier call is measured
    #: against the closest earlier sequence.
    drift_at: Optional[int] = None
    #: The ``call_index`` of the call this drifting prompt departs from (None without drift).
    drift_from: Optional[int] = None
    #: The ``model_call_id`` of the earlier call this one repeated byte for byte (a retry), if any.
    retry_of: Optional[str] = None
    #: Prefix supply (the token mode's default; ``--no-supply-prefix`` turns it off): True when the
    #: prompt was sent as the parent's exact ids and the upstream's reported prompt proves it, False
    #: when sent but not proved (then this is drift like any other), None when none was supplied.
    prefix_supplied: Optional[bool] = None
    #: The weight versions that sampled the generation: ``{"version", "start", "end"}`` over
    #: generation token indexes (``end`` None: to the end), from ``weight_version_source``
    #: (``engine`` or ``declared``; `records.contract._weight_versions`). `token_weight_versions` per token.
    weight_versions: Optional[list[dict[str, Any]]] = None
    weight_version_source: Optional[str] = None
    #: A weight update fell during this call where it could not be placed (a non-streamed reply).
    weight_versions_unplaced: bool = False
    #: The ``model_call_id`` of the aborted call (``finish_reason: "abort"``) this call resumes: its
    #: prompt is that call's prompt + partial generation.
    resumes: Optional[str] = None
    #: Its routed experts (``--capture-routed-experts``): the token entry's reference to the stored
    #: object (``sha256``, ``dtype``, ``shape``, ``start``), read by `records.read_routed_experts`.
    routed_experts: Optional[dict[str, Any]] = None
    #: The token capture mode's calls: the trajectory builder's verdict (`records.CallLink`'s
    #: ``status``: ``root``, ``extends``, ``unlinked``, ``left_out``), which ``extends``,
    #: ``drift_at`` and ``drift_from`` then say too; None for a call whose arrays are on its line
    #: only (no token file: the lines' lineage places it).
    link: Optional[str] = None
    #: Why the builder does not take the call as a plain root or extension (`records.CallLink`'s
    #: ``reason``: ``parent_digest_mismatch``, ``retry_not_kept``, ...): an ``unlinked`` call masks
    #: its rollout (`records.trajectories`).
    link_reason: Optional[str] = None

    @property
    def token_weight_versions(self) -> Optional[list[Optional[str]]]:
        """One weight version per generated token, or None when none is known."""
        if self.weight_versions is None or self.generation_token_ids is None:
            return None
        spans = resolved_spans(self.weight_versions, len(self.generation_token_ids))
        return token_versions(spans, len(self.generation_token_ids)) if spans is not None else None

    @property
    def weight_version_labels(self) -> tuple[str, ...]:
        """The versions that sampled this generation, in order (empty when none is known)."""
        return tuple(dict.fromkeys(span["version"] for span in self.weight_versions or ()))

    @property
    def first_token_weight_version(self) -> Optional[str]:
        """The version that sampled the generation's first token (what vLLM's RFC #54443 asks the
        engine to report), or None when none is known: the span that covers token 0."""
        for span in self.weight_versions or ():
            if span.get("start", 0) <= 0 and (span.get("end") is None or span["end"] > 0):
                return span["version"]
        return None

    @property
    def spans_weight_update(self) -> bool:
        """More than one weight version sampled this generation (or an update fell in it unplaced)."""
        return self.weight_versions_unplaced or len({span["version"] for span in self.weight_versions or ()}) > 1

    @property
    def unusable_reason(self) -> Optional[str]:
        """Why this generation must not be trained on, or None when it may be."""
        if self.error_category is not None and self.error_category not in _SEEN_WHOLE_CATEGORIES:
            return f"the call ended {self.error_category}: the agent did not see this generation whole"
        if self.finish_reason is None:
            return "no finish reason: the generation did not end"
        if self.finish_reason == "abort":
            return "finish reason 'abort': the engine stopped it (a weight update); a later call may resume it"
        if self.finish_reason in _UNFINISHED_REASONS:
            return f"finish reason {self.finish_reason!r}: the generation did not end"
        if self.missing:
            return "missing " + ", ".join(self.missing)
        return self.problem

    @property
    def usable(self) -> bool:
        """All three arrays present and consistent, for a generation the agent saw end: safe to train on."""
        return self.unusable_reason is None


def names_token_entries(line: dict[str, Any]) -> bool:
    """The line leaves its arrays to the rollout's token file (the token capture mode wrote it)."""
    named = line.get("token_entries")
    return isinstance(named, list) and bool(named)


def has_token_arrays(response: Any) -> bool:
    """A cheap look: does this response carry any of the arrays `token_records_of_line` reads?"""
    if type(response) is not dict:
        return False
    if response.get("prompt_token_ids") is not None or response.get("input_messages") is not None:
        return True
    choices = response.get("choices")
    first = choices[0] if type(choices) is list and choices and type(choices[0]) is dict else None
    if first is None:
        return False
    message = first.get("message")
    return (first.get("token_ids") is not None or first.get("prompt_token_ids") is not None
            or (type(message) is dict and message.get("generation_token_ids") is not None))


def token_records_of_line(line: dict[str, Any], rollout_id: str, call_index: int) -> list[TokenRecord]:
    """The records of one capture line: one per choice (one for a call without choices)."""
    response = line.get("response")
    call_id = line.get("model_call_id") if isinstance(line.get("model_call_id"), str) else None
    category = line.get("error_category") if isinstance(line.get("error_category"), str) else None
    base = {"rollout_id": rollout_id, "model_call_id": call_id, "call_index": call_index, "error_category": category,
            "retry_of": line.get("retry_of") if isinstance(line.get("retry_of"), str) else None}
    for name, kind in _LINE_EXTRAS:
        value = line.get(name)
        if type(value) is kind:
            base[name] = value
    if line.get("dialect") == "generate" and isinstance(response, dict) and response.get("prompt_token_ids") is None:
        # vLLM's token-in/token-out path: the prompt is the request's own ids (the reply repeats
        # them only with ``return_token_ids``).
        request = line.get("request")
        prompt = request.get("token_ids") if isinstance(request, dict) else None
        if isinstance(prompt, list):
            response = {**response, "prompt_token_ids": prompt}
    records = _records_of_response(base, response)
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list):  # Routed experts stored apart: the reply's choice names them.
        records = [_with_routed_experts(record, choices) for record in records]
    versions = line.get("weight_versions")
    if type(versions) is list and versions:
        records = [record.model_copy(update={"weight_versions": versions[position]})
                   if position < len(versions) and type(versions[position]) is list else record
                   for position, record in enumerate(records)]
    return records


def _with_routed_experts(record: TokenRecord, choices: list[Any]) -> TokenRecord:
    choice = choices[record.choice_index] if record.choice_index < len(choices) else None
    reference = choice.get("routed_experts") if isinstance(choice, dict) else None
    if isinstance(reference, dict) and isinstance(reference.get("sha256"), str):
        return record.model_copy(update={"routed_experts": reference})
    return record


#: Line fields a record carries as they are, with their JSON type.
_LINE_EXTRAS = (("prefix_supplied", bool), ("weight_version_source", str), ("weight_versions_unplaced", bool),
                ("resumes", str))


def _records_of_response(base: dict[str, Any], response: Any) -> list[TokenRecord]:
    if not isinstance(response, dict):
        return [_record(base, 0, None, None, None, None, None)]
    model = response.get("model") if isinstance(response.get("model"), str) else None
    top_prompt = response.get("prompt_token_ids")
    choices = response.get("choices")
    # SGLang: the ids in the response-level ``sglext`` (``input_ids``; ``output_ids`` per choice).
    sglext = response.get("sglext")
    sglext_outputs = sglext.get("output_ids") if isinstance(sglext, dict) else None
    if top_prompt is None and isinstance(sglext, dict):
        top_prompt = sglext.get("input_ids")
    if isinstance(choices, list) and choices:
        records = []
        for position, choice in enumerate(choices):
            if not isinstance(choice, dict):
                continue
            index = choice.get("index")
            index = index if isinstance(index, int) and not isinstance(index, bool) else position
            if isinstance(sglext_outputs, list) and index < len(sglext_outputs) and choice.get("token_ids") is None:
                choice = {**choice, "token_ids": sglext_outputs[index]}
            message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
            finish = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
            # Completions: vLLM writes the prompt ids on each choice, not on the response.
            prompt = choice.get("prompt_token_ids") if choice.get("prompt_token_ids") is not None else top_prompt
            record = _record(base, index, model, finish, prompt, message, choice)
            if isinstance(sglext, dict) and record.source == "vllm":
                record = record.model_copy(update={"source": "sglang"})
            records.append(record)
        return records
    status = response.get("status") if isinstance(response.get("status"), str) else None
    # Responses: NeMo RL puts the arrays on one output item; Anthropic Messages carries none.
    for item in response.get("output") or ():
        if isinstance(item, dict) and any(item.get(name) is not None for name in _ARRAYS):
            return [_record(base, 0, model, status, top_prompt, item, None)]
    if "output" in response:
        return [_responses_record(base, model, response, status)]
    finish = response.get("stop_reason") if isinstance(response.get("stop_reason"), str) else None
    return [_record(base, 0, model, finish, top_prompt, None, None)]


def _responses_record(base: dict[str, Any], model: Optional[str], response: dict[str, Any],
                      status: Optional[str]) -> TokenRecord:
    """vLLM's Responses arrays: ``input_messages`` / ``output_messages`` tokens (``enable_response_messages``)
    and the ``output_text`` parts' logprobs (``include: ["message.output_text.logprobs"]``)."""
    problems: list[str] = []
    prompt = _message_tokens(response.get("input_messages"), "prompt_token_ids", problems)
    ids = _message_tokens(response.get("output_messages"), "generation_token_ids", problems)
    entries: Optional[list[Any]] = None
    for item in response.get("output") or ():
        for part in (item.get("content") or ()) if isinstance(item, dict) else ():
            if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("logprobs"), list):
                entries = (entries or []) + part["logprobs"]
    log_probs = _entry_logprobs(entries, problems) if entries is not None else None
    if ids is not None and log_probs is not None and len(ids) != len(log_probs):
        # vLLM's Responses stream (simple_streaming_events.py, "filter empty delta") sends no event
        # for a token whose text is empty -- part of a UTF-8 character -- so that token's logprob
        # is nowhere; the whole reply (stream: false) and chat carry every one. Which position
        # lacks it cannot be told from the ids: nothing is guessed, the call is not trained on.
        problems.append(f"generation_token_ids has {len(ids)} entries but generation_log_probs has {len(log_probs)}"
                        + (": vLLM's Responses stream sends no logprob for a token whose text is empty (part of a"
                           " UTF-8 character); ask for the whole reply or use chat" if len(log_probs) < len(ids) else ""))
    found: dict[str, Any] = {"prompt_token_ids": prompt, "generation_token_ids": ids, "generation_log_probs": log_probs}
    source = "vllm" if ids is not None else "missing"
    finish = _responses_finish(response, status)
    return TokenRecord.model_construct(
        **base, choice_index=0, model=model, finish_reason=finish, source=source,
        missing=tuple(name for name in _ARRAYS if found[name] is None), problem="; ".join(problems) or None, **found)


def _responses_finish(response: dict[str, Any], status: Optional[str]) -> Optional[str]:
    """The status, or for an incomplete response its reason (``max_output_tokens``), as chat's ``length``."""
    details = response.get("incomplete_details")
    if status == "incomplete" and isinstance(details, dict) and isinstance(details.get("reason"), str):
        return details["reason"]
    return status


def _message_tokens(messages: Any, name: str, problems: list[str]) -> Optional[list[int]]:
    """The ``tokens`` of vLLM's ``raw_message_tokens`` entries, concatenated in order."""
    if not isinstance(messages, list) or not messages:
        return None
    ids: list[int] = []
    for message in messages:
        tokens = message.get("tokens") if isinstance(message, dict) else None
        checked = _ints(tokens, name, problems)
        if checked is None:
            return None
        ids.extend(checked)
    return ids


def _record(base: dict[str, Any], choice_index: int, model: Optional[str], finish_reason: Optional[str],
            top_prompt: Any, message: Optional[dict[str, Any]], choice: Optional[dict[str, Any]]) -> TokenRecord:
    problems: list[str] = []
    message = message or {}
    prompt_raw = message.get("prompt_token_ids")
    prompt = _ints(prompt_raw if prompt_raw is not None else top_prompt, "prompt_token_ids", problems)
    source, ids, log_probs = _generation(message, choice or {}, problems)
    if ids is not None and log_probs is not None and len(ids) != len(log_probs):
        problems.append(f"generation_token_ids has {len(ids)} entries but generation_log_probs has {len(log_probs)}")
    found: dict[str, Any] = {"prompt_token_ids": prompt, "generation_token_ids": ids, "generation_log_probs": log_probs}
    # Validated above: construct without re-checking 64k numbers per call.
    return TokenRecord.model_construct(
        **base, choice_index=choice_index, model=model, finish_reason=finish_reason, source=source,
        missing=tuple(name for name in _ARRAYS if found[name] is None), problem="; ".join(problems) or None, **found)


def _generation(message: dict[str, Any], choice: dict[str, Any],
                problems: list[str]) -> tuple[str, Optional[list[int]], Optional[list[float]]]:
    if message.get("generation_token_ids") is not None or message.get("generation_log_probs") is not None:
        return ("message", _ints(message.get("generation_token_ids"), "generation_token_ids", problems),
                _floats(message.get("generation_log_probs"), problems))
    logprobs = choice.get("logprobs")
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    entries = entries if isinstance(entries, list) else None
    log_probs = None
    if entries is not None:
        log_probs = _entry_logprobs(entries, problems)
    elif isinstance(logprobs, dict) and isinstance(logprobs.get("token_logprobs"), list):
        # Completions: parallel lists (``tokens``, ``token_logprobs``, ...), not entries.
        log_probs = _floats(logprobs["token_logprobs"], problems)
        tokens = logprobs.get("tokens")
        if isinstance(tokens, list):
            entries = [{"token": token} for token in tokens]
    token_ids = choice.get("token_ids")
    if token_ids is not None:
        ids = _ints(token_ids, "generation_token_ids", problems)
        from_tokens = _ids_from_tokens(entries)
        if ids is not None and from_tokens is not None and from_tokens != ids:
            problems.append("token_ids disagree with the token_id:N tokens of logprobs.content")
        return "vllm", ids, log_probs
    from_tokens = _ids_from_tokens(entries)
    if from_tokens is not None:
        return "logprob_tokens", from_tokens, log_probs
    return "missing", None, log_probs


def _entry_logprobs(entries: list[Any], problems: list[str]) -> Optional[list[float]]:
    """Each logprob entry's ``logprob`` (vLLM's ``logprobs.content`` shape)."""
    try:  # dict.get mapped over the entries runs in C; an entry that is not a dict takes the slow path.
        picked = list(map(dict.get, entries, repeat("logprob")))
    except TypeError:
        picked = [entry.get("logprob") if isinstance(entry, dict) else None for entry in entries]
    return _floats(picked, problems)


def _ids_from_tokens(entries: Optional[list[Any]]) -> Optional[list[int]]:
    """The ids of ``token_id:N`` tokens, when every entry has one (else None: plain text tokens)."""
    if not entries:
        return None
    ids = []
    for entry in entries:
        token = entry.get("token") if isinstance(entry, dict) else None
        if not isinstance(token, str) or not token.startswith(_TOKEN_ID_PREFIX):
            return None
        number = token[len(_TOKEN_ID_PREFIX):]
        if not number.isdigit():
            return None
        ids.append(int(number))
    return ids


def _ints(values: Any, name: str, problems: list[str]) -> Optional[list[int]]:
    if values is None:
        return None
    # set(map(type, ...)) walks the list in C: twice as fast as a generator, the same test.
    if not isinstance(values, list) or not set(map(type, values)) <= _INT:
        problems.append(f"{name} is not a list of integers")
        return None
    return values


def _floats(values: Any, problems: list[str]) -> Optional[list[float]]:
    if values is None:
        return None
    types = set(map(type, values)) if isinstance(values, list) else None
    if types is None or not types <= _NUMBER:
        problems.append("generation_log_probs is not a list of numbers")
        return None
    return values if types <= _FLOAT else [float(value) for value in values]


_INT, _FLOAT, _NUMBER = frozenset({int}), frozenset({float}), frozenset({int, float})
