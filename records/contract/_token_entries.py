"""Training-token entries: one line per model call in ``<rollout_id>.tokens.jsonl`` (docs/tokens.md).

NeMo Gym 0.7.0's ``TokenEntry`` (schema version 1, ``nemo_gym/token_id_capture/records.py``) is the
contract; this is our code for it. An entry holds the exact prompt ids, the generated ids and their
logprobs (each token once: an int and a float), the output items without token arrays, and the
lineage fields: which call it continues (``parent_call_id``, ``parent_resolution`` root / resolved /
unresolved and its reason), the length and digest of its whole sequence (``cum_len``, ``digest``),
and what a later request is matched by (``continuation_*``). A resolved child whose prompt extends
its parent's sequence stores only the suffix (``prompt_is_delta``): storage grows with the tokens,
not with the square of the turns.

Lines are written with sorted keys and every field present, as Gym's store writes them, so Gym's
own `TokenCaptureStore` indexes and reads them unchanged.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from array import array as packed_array
from typing import Any, Optional

from ._fingerprints import FINGERPRINT_VERSION, assistant_fingerprint, conversation_digest

TOKEN_ENTRY_SCHEMA_VERSION = 1
ROOT, RESOLVED, UNRESOLVED = "root", "resolved", "unresolved"
#: The keys an entry carries token arrays under, on an output item too (stripped there).
_TOKEN_KEYS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts")
_DIGEST_VERSION = 1
_DIGEST_DOMAIN = b"nemo-gym-tokens"
_EMPTY_DIGEST = hashlib.sha256(_DIGEST_DOMAIN).hexdigest()
#: Gym's pseudo-turn for the request fields that shape the prompt beside the turns.
_ENVELOPE_ROLE = "_ng_request_envelope"


def token_digest(token_ids: list[int]) -> str:
    """SHA-256 of a token sequence in Gym's encoding: a version byte, the count and each id as
    big-endian unsigned 64-bit integers, under a domain prefix."""
    if not token_ids:
        return _EMPTY_DIGEST
    try:  # An array packs the ids in C: half of `struct.pack(*ids)`'s time (a prompt is thousands).
        packed = packed_array("Q", token_ids)
    except (OverflowError, TypeError):
        raise ValueError("token ids must be integers in [0, 2**64)") from None
    if sys.byteorder == "little":
        packed.byteswap()
    digest = hashlib.sha256(_DIGEST_DOMAIN)
    digest.update(struct.pack(">BQ", _DIGEST_VERSION, len(token_ids)))
    digest.update(packed)
    return digest.hexdigest()


def request_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A request's turns as lineage sees them (Gym's ``_request_messages``): Chat and Anthropic
    ``messages``, Responses ``input`` items, after a pseudo-turn holding
    ``instructions`` and ``tools`` when the request has them (they shape the prompt too)."""
    turns = body.get("messages")
    if not isinstance(turns, list):
        turns = body.get("input")  # A string input is no turn to Gym: its calls are roots either way.
    turns = [turn for turn in turns if turn is not None] if isinstance(turns, list) else []
    instructions, tools = body.get("instructions"), body.get("tools")
    if not instructions and not tools:
        return turns
    envelope = json.dumps({"instructions": instructions, "tools": tools}, sort_keys=True, default=str)
    return [{"role": _ENVELOPE_ROLE, "content": envelope}, *turns]


def output_items(response: dict[str, Any], choice: Optional[int] = None) -> list[dict[str, Any]]:
    """What the model produced, as Responses-style items without token arrays (Gym's
    ``response_to_output_items``): Responses ``output``; Anthropic content (thinking as reasoning
    items); Chat each choice's message (``choice``: that one only, for n > 1)."""
    output = response.get("output")
    if isinstance(output, list) and output:
        return [_without_arrays(item) for item in output if isinstance(item, dict)]
    if response.get("type") == "message" and response.get("role") == "assistant":
        return _anthropic_items(response.get("content") or [])
    items = []
    choices = response.get("choices") or []
    for position, entry in enumerate(choices):
        if choice is not None and position != choice:
            continue
        message = (entry or {}).get("message") or {}
        if isinstance(message, dict):
            items.append(_without_arrays({"type": "message", "role": "assistant", **message}))
    return items


def token_entry(*, rollout_id: str, model_call_id: str, model: str, prompt_token_ids: list[int],
                generation_token_ids: list[int], generation_log_probs: list[float], items: list[dict[str, Any]],
                response_id: Optional[str], created_at: float, request: list[dict[str, Any]],
                parent_call_id: Optional[str], parent_resolution: str, reason: str,
                parent_sequence: Optional[list[int]] = None) -> dict[str, Any]:
    """One entry, every field of Gym's schema present. ``parent_sequence``: the resolved parent's
    whole sequence; when the prompt begins with it, only the rest of the prompt is stored."""
    sequence = [*prompt_token_ids, *generation_token_ids]
    stored_prompt, delta = prompt_token_ids, False
    if parent_resolution == RESOLVED and parent_sequence is not None and _starts_with(prompt_token_ids, parent_sequence):
        stored_prompt, delta = prompt_token_ids[len(parent_sequence):], True
    return {
        "cum_len": len(sequence),
        "continuation_context_digest": conversation_digest(request),
        "continuation_context_len": len(request),
        "continuation_fingerprint": assistant_fingerprint([*request, *items]),
        "created_at": created_at,
        "digest": token_digest(sequence),
        "fingerprint_version": FINGERPRINT_VERSION,
        "generation_log_probs": generation_log_probs,
        "generation_token_ids": generation_token_ids,
        "model": model,
        "model_call_id": model_call_id,
        "output_items": items,
        "parent_call_id": parent_call_id if parent_resolution == RESOLVED else None,
        "parent_resolution": parent_resolution,
        "parent_resolution_reason": reason,
        "prefix_requested": False,
        "prefix_supplied": False,
        "prompt_is_delta": delta,
        "prompt_token_ids": stored_prompt,
        "response_id": response_id,
        "rollout_id": rollout_id,
        "routed_experts": None,
        "schema_version": TOKEN_ENTRY_SCHEMA_VERSION,
        "token_item_index": None,
    }


def entry_sequence(entry: dict[str, Any], parent_sequence: Optional[list[int]]) -> list[int]:
    """An entry's whole sequence (prompt + generation), its delta prompt after its parent's."""
    prompt = entry["prompt_token_ids"]
    if entry.get("prompt_is_delta"):
        if parent_sequence is None:
            raise ValueError(f"model call {entry['model_call_id']} stores a delta prompt and its parent is unknown")
        prompt = [*parent_sequence, *prompt]
    return [*prompt, *entry["generation_token_ids"]]


class TokenEntryProblem(ValueError):
    """An entry line that is not a schema-1 entry this reader can trust."""


def check_token_entry(entry: Any) -> dict[str, Any]:
    """``entry`` (a parsed line) if it is an entry we can read, else `TokenEntryProblem` saying why:
    a newer schema is refused (its fields may change the arrays' meaning), as Gym refuses it."""
    if not isinstance(entry, dict):
        raise TokenEntryProblem("the line is not a JSON object")
    version = entry.get("schema_version", TOKEN_ENTRY_SCHEMA_VERSION)
    if version != TOKEN_ENTRY_SCHEMA_VERSION:
        raise TokenEntryProblem(f"schema_version {version!r}; this reader understands {TOKEN_ENTRY_SCHEMA_VERSION}")
    for key in ("rollout_id", "model_call_id"):
        if not isinstance(entry.get(key), str):
            raise TokenEntryProblem(f"{key} is missing")
    arrays: list[Any] = [entry.get(key) for key in ("prompt_token_ids", "generation_token_ids", "generation_log_probs")]
    if not all(isinstance(array, list) for array in arrays):
        raise TokenEntryProblem("a token array is missing")
    if len(arrays[1]) != len(arrays[2]):
        raise TokenEntryProblem(f"{len(arrays[1])} generated ids but {len(arrays[2])} logprobs")
    if entry.get("prompt_is_delta") and (entry.get("parent_resolution") != RESOLVED or not entry.get("parent_call_id")):
        raise TokenEntryProblem("a delta prompt without a resolved parent")
    return entry


def _starts_with(sequence: list[int], prefix: list[int]) -> bool:
    return len(sequence) >= len(prefix) and sequence[:len(prefix)] == prefix


def _without_arrays(item: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in item.items() if key not in _TOKEN_KEYS}


def _anthropic_items(content: list[Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    message: list[Any] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "thinking":
            text = block.get("thinking")
            items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]
                          if isinstance(text, str) else []})
        elif kind == "redacted_thinking":
            item: dict[str, Any] = {"type": "reasoning", "summary": []}
            if block.get("data") is not None:
                item["encrypted_content"] = block["data"]
            items.append(item)
        else:
            message.append(block)
    if message:
        items.append({"type": "message", "role": "assistant", "content": message})
    return items
