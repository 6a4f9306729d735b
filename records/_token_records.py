"""Training arrays from captured calls: `read_token_records` (DESIGN §8, issue 13).

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
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional, Union

from pydantic import BaseModel, ConfigDict

from ._store import CaptureStore, gc_paused

#: Where the generation arrays were found (see the module docstring); ``missing`` when nowhere.
TOKEN_SOURCES = ("message", "vllm", "logprob_tokens", "missing")
_ARRAYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
_TOKEN_ID_PREFIX = "token_id:"


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
    #: ``message``, ``vllm``, ``logprob_tokens`` or ``missing``: where the generation arrays came from.
    source: str = "missing"
    #: The arrays that were not found, among prompt_token_ids, generation_token_ids, generation_log_probs.
    missing: tuple[str, ...] = ()
    #: Why the arrays cannot be trusted as they are (lengths disagree, a value is not a number), or None.
    problem: Optional[str] = None

    @property
    def usable(self) -> bool:
        """All three arrays present and consistent: safe to train on."""
        return not self.missing and self.problem is None


def iter_token_records(store: Union[CaptureStore, str, "os.PathLike[str]"], rollout_id: str) -> Iterator[TokenRecord]:
    """`TokenRecord`\\ s of a rollout, one line at a time (only one call's arrays alive at once).

    Tolerant, as `read_model_call_records`: a torn or malformed line is skipped.
    """
    if not isinstance(store, CaptureStore):
        store = CaptureStore(store)
    for call_index, line in store.iter_available(rollout_id):
        if line is not None:
            yield from token_records_of_line(line, rollout_id, call_index)


def read_token_records(store: Union[CaptureStore, str, "os.PathLike[str]"], rollout_id: str) -> list[TokenRecord]:
    """Every `TokenRecord` of a rollout, in append order, then choice order."""
    with gc_paused():  # Millions of small ints and floats: see `gc_paused`.
        return list(iter_token_records(store, rollout_id))


def token_records_of_line(line: dict[str, Any], rollout_id: str, call_index: int) -> list[TokenRecord]:
    """The records of one capture line: one per choice (one for a call without choices)."""
    response = line.get("response")
    call_id = line.get("model_call_id") if isinstance(line.get("model_call_id"), str) else None
    category = line.get("error_category") if isinstance(line.get("error_category"), str) else None
    base = {"rollout_id": rollout_id, "model_call_id": call_id, "call_index": call_index, "error_category": category}
    if not isinstance(response, dict):
        return [_record(base, 0, None, None, None, None, None)]
    model = response.get("model") if isinstance(response.get("model"), str) else None
    top_prompt = response.get("prompt_token_ids")
    choices = response.get("choices")
    if isinstance(choices, list) and choices:
        records = []
        for position, choice in enumerate(choices):
            if not isinstance(choice, dict):
                continue
            index = choice.get("index")
            index = index if isinstance(index, int) and not isinstance(index, bool) else position
            message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
            finish = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
            records.append(_record(base, index, model, finish, top_prompt, message, choice))
        return records
    # Responses: NeMo RL puts the arrays on one output item; Anthropic Messages carries none.
    for item in response.get("output") or ():
        if isinstance(item, dict) and any(item.get(name) is not None for name in _ARRAYS):
            status = response.get("status") if isinstance(response.get("status"), str) else None
            return [_record(base, 0, model, status, top_prompt, item, None)]
    finish = response.get("stop_reason") if isinstance(response.get("stop_reason"), str) else None
    return [_record(base, 0, model, finish, top_prompt, None, None)]


def _record(base: dict[str, Any], choice_index: int, model: Optional[str], finish_reason: Optional[str],
            top_prompt: Any, message: Optional[dict[str, Any]], choice: Optional[dict[str, Any]]) -> TokenRecord:
    problems: list[str] = []
    message = message or {}
    prompt_raw = message.get("prompt_token_ids")
    prompt = _ints(prompt_raw if prompt_raw is not None else top_prompt, "prompt_token_ids", problems)
    source, ids, log_probs = _generation(message, choice or {}, problems)
    if ids is not None and log_probs is not None and len(ids) != len(log_probs):
        problems.append(f"generation_token_ids has {len(ids)} entries but generation_log_probs has {len(log_probs)}")
    found = {"prompt_token_ids": prompt, "generation_token_ids": ids, "generation_log_probs": log_probs}
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
        log_probs = _floats([entry.get("logprob") if isinstance(entry, dict) else None for entry in entries], problems)
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
    if not isinstance(values, list) or not all(type(value) is int for value in values):
        problems.append(f"{name} is not a list of integers")
        return None
    return values


def _floats(values: Any, problems: list[str]) -> Optional[list[float]]:
    if values is None:
        return None
    if not isinstance(values, list) or not all(type(value) in (float, int) for value in values):
        problems.append("generation_log_probs is not a list of numbers")
        return None
    return values if all(type(value) is float for value in values) else [float(value) for value in values]
