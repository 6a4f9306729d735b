"""Which earlier call a request continues: the hashes NeMo Gym 0.7.0 resolves lineage with
(docs/tokens.md; Gym's ``nemo_gym/token_id_capture/fingerprint.py`` is the contract, this is our code).

`assistant_fingerprint` hashes only the model-authored turns of a request (assistant messages,
Responses ``function_call`` items), in order: it names the call that produced the last of them,
whatever the dialect -- Chat ``tool_calls``, Anthropic ``tool_use`` blocks and Responses items hash
alike. `conversation_digest` hashes every turn (roles, content, tool calls, tool results) and
checks that the context a call was made with is the one a child claims.

Each field goes into SHA-256 tagged and length-delimited (a tag byte, 8 bytes of big-endian
length, the UTF-8 bytes), under a domain prefix, so no two field sequences hash alike. Tool
arguments compare canonicalised (sorted keys, compact separators): harnesses re-serialise them.
A request item that is not an object raises ValueError, as Gym's does.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterator

import orjson

#: Gym's ``FINGERPRINT_VERSION``: entries stamped with another version are never matched.
FINGERPRINT_VERSION = 2

_FINGERPRINT_DOMAIN = b"nemo-gym-lineage"
_CONTEXT_DOMAIN = b"nemo-gym-lineage-context"
#: Content blocks whose text is hashed as plain text (any other type hashes as canonical JSON).
_TEXT_BLOCKS = frozenset({"", "text", "input_text", "output_text"})


def assistant_fingerprint(messages: list[dict[str, Any]]) -> str:
    """The model-authored turns' hash, or ``""`` when the request has none (a root call)."""
    hasher = hashlib.sha256(_FINGERPRINT_DOMAIN)
    authored = 0
    for message in _objects(messages):
        if message.get("role") != "assistant" and message.get("type") != "function_call":
            continue  # Reasoning items are left out: harnesses differ in echoing them.
        authored += 1
        for kind, text in _content_parts(message.get("content")):
            _field(hasher, b"\x00", kind)
            _field(hasher, b"\x01", text)
        for call_id, name, arguments in _tool_calls(message):
            _field(hasher, b"\x02", call_id)
            _field(hasher, b"\x03", name)
            _field(hasher, b"\x04", arguments)
    return hasher.hexdigest() if authored else ""


def conversation_digest(messages: list[dict[str, Any]]) -> str:
    """Every turn's hash: the whole context of a request."""
    hasher = hashlib.sha256(_CONTEXT_DOMAIN)
    for message in _objects(messages):
        _field(hasher, b"\x00", str(message.get("role") or message.get("type") or ""))
        for kind, text in _content_parts(message.get("content")):
            _field(hasher, b"\x01", kind)
            _field(hasher, b"\x02", text)
        for call_id, name, arguments in _tool_calls(message):
            _field(hasher, b"\x03", call_id)
            _field(hasher, b"\x04", name)
            _field(hasher, b"\x05", arguments)
        for call_id, output in _tool_results(message):
            _field(hasher, b"\x06", call_id)
            _field(hasher, b"\x07", output)
    return hasher.hexdigest()


def canonical_arguments(value: Any) -> str:
    """Tool arguments as compared: JSON text parsed and written with sorted keys; text that is
    not JSON stripped; None empty."""
    if value is None:
        return ""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value.strip()
    return _canonical_json(value)


def _objects(messages: list[Any]) -> Iterator[dict[str, Any]]:
    for message in messages or []:
        if not isinstance(message, dict):
            raise ValueError(f"request item is not an object: {type(message).__name__}")
        yield message


def _content_parts(content: Any) -> list[tuple[str, str]]:
    """(kind, text) of each content part; tool calls and results are hashed on their own."""
    if content is None:
        return []
    if isinstance(content, str):
        return [("text", content)] if content else []
    if not isinstance(content, list):
        raise ValueError(f"unsupported message content: {type(content).__name__}")
    parts = []
    for block in content:
        if isinstance(block, str):
            if block:
                parts.append(("text", block))
            continue
        if not isinstance(block, dict):
            raise ValueError(f"unsupported content block: {type(block).__name__}")
        kind = str(block.get("type") or "")
        if kind in ("tool_use", "tool_result"):
            continue
        if kind in _TEXT_BLOCKS and isinstance(block.get("text"), str):
            if block["text"]:
                parts.append(("text", block["text"]))
            continue
        if not kind:
            raise ValueError("content block has no supported type")
        parts.append((kind, _canonical_json(block)))
    return parts


def _tool_calls(message: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(id, name, canonical arguments) of a Responses ``function_call`` item, Anthropic
    ``tool_use`` blocks and Chat ``tool_calls``, in that order."""
    calls = []
    if message.get("type") == "function_call":
        name = str(message.get("name", ""))
        if message.get("namespace"):  # Two tools of one short name in different namespaces differ.
            name = f"{message['namespace']}__{name}"
        calls.append((str(message.get("call_id") or message.get("id") or ""), name,
                      canonical_arguments(message.get("arguments"))))
    content = message.get("content")
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict) and block.get("type") == "tool_use":
            calls.append((str(block.get("id") or ""), str(block.get("name", "")), canonical_arguments(block.get("input"))))
    for call in message.get("tool_calls") or []:
        function = (call or {}).get("function") or {}
        calls.append((str((call or {}).get("id") or ""), str(function.get("name", "")),
                      canonical_arguments(function.get("arguments"))))
    return calls


def _tool_results(message: dict[str, Any]) -> list[tuple[str, str]]:
    """(call id, output) of a Responses ``function_call_output``, a Chat ``tool`` message and
    Anthropic ``tool_result`` blocks."""
    results = []
    if message.get("type") == "function_call_output":
        output = message.get("output")
        results.append((str(message.get("call_id") or message.get("id") or ""),
                        output if isinstance(output, str) else _canonical_json(output)))
    elif message.get("role") == "tool":
        content = message.get("content")
        results.append((str(message.get("tool_call_id") or ""),
                        content if isinstance(content, str) else _canonical_json(content)))
    content = message.get("content")
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict) and block.get("type") == "tool_result":
            inner = block.get("content")
            results.append((str(block.get("tool_use_id") or block.get("id") or ""),
                            inner if isinstance(inner, str) else _canonical_json(inner)))
    return results


def _canonical_json(value: Any) -> str:
    """Sorted-key compact JSON, as Gym writes it (orjson); an integer beyond 64 bits, which orjson
    refuses (so Gym abstains from hashing it), is written as `json` writes it, its exact digits:
    vLLM's tool-call arguments hold such integers (docs/files.md), and a call must not lose its
    entry, nor its next turn its parent, for one. Everything Gym can hash hashes alike."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode("utf-8")
    except (TypeError, orjson.JSONEncodeError) as error:
        try:
            return orjson.dumps(_big_integers_as_written(value), option=orjson.OPT_SORT_KEYS).decode("utf-8")
        except (TypeError, orjson.JSONEncodeError):
            raise ValueError(f"unsupported prompt content: {type(value).__name__}") from error


#: orjson writes integers in [-2**63, 2**64); others only through a `orjson.Fragment` of their digits.
_INT_RANGE = range(-(2 ** 63), 2 ** 64)


def _big_integers_as_written(value: Any) -> Any:
    """``value`` with every integer orjson cannot write replaced by its digits, as a raw fragment."""
    if isinstance(value, dict):
        return {key: _big_integers_as_written(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_big_integers_as_written(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and value not in _INT_RANGE:
        return orjson.Fragment(str(value).encode())
    return value


def _field(hasher: Any, tag: bytes, value: str) -> None:
    encoded = value.encode("utf-8")
    hasher.update(tag)
    hasher.update(len(encoded).to_bytes(8, "big"))
    hasher.update(encoded)
