"""Reading the three response shapes: tool calls, reasoning, output items, finish reason (docs/records.md).

Responses (``object: "response"``, ``output`` items), Chat Completions (``choices[*].message``)
and Anthropic Messages (``content`` blocks). Every function tolerates malformed input: a shape
it does not recognise yields nothing rather than an exception. Where the seed is silent, NeMo
Gym 0.7.0's reader decides: tool calls and reasoning come from every chat choice (n > 1), and
a finish reason or status is read from a partial reply that has no recognisable shape.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Iterator, NamedTuple, Optional

import json
import re

import orjson

from ._models import ModelOperationObservation, all_fields_set, construct_checked

_OPERATION_FIELDS = all_fields_set(ModelOperationObservation)

# Responses output item types the model produces for server-side (built-in) tools.
_RESPONSES_CLIENT_TOOL_ITEMS = ("function_call", "custom_tool_call")


def response_shape(response: Any) -> Optional[str]:
    """``responses``, ``chat``, ``completions`` or ``messages`` for a response object of that shape, else None."""
    if not isinstance(response, dict):
        return None
    if response.get("object") == "response" or isinstance(response.get("output"), list):
        return "responses"
    choices = response.get("choices")
    if isinstance(choices, list):
        # Completions (``text_completion``): choices carry ``text``, never a ``message``.
        if response.get("object") == "text_completion" or (
                choices and isinstance(choices[0], dict) and "text" in choices[0] and "message" not in choices[0]):
            return "completions"
        return "chat"
    if response.get("type") == "message" or isinstance(response.get("content"), list):
        return "messages"
    return None


class ResponseFacts(NamedTuple):
    """Everything a record derives from a response object, computed in one pass over it."""

    shape: Optional[str] = None
    tool_calls: list[dict[str, Any]] = []
    reasoning: Optional[str] = None
    finish_reason: Optional[str] = None
    operations: Optional[list[ModelOperationObservation]] = None
    #: Responses ``status`` (completed, incomplete, failed, ...).
    status: Optional[str] = None


def describe_response(response: Any, operations: bool = True) -> ResponseFacts:
    """Tool calls, reasoning, finish reason, output operations and status of any response shape.

    ``operations=False`` skips the `ModelOperationObservation` list (scans that do not show it).
    """
    shape = response_shape(response)
    if shape is None:
        if not isinstance(response, dict) or not response:
            return _NO_FACTS
        # A partial reply (a bare `stop_reason`, `incomplete_details`, `status`): what it says.
        return _facts((None, [], None, finish_reason_of(response, None), None, _status(response)))
    if shape == "chat":
        return _describe_chat(response, operations)
    if shape == "completions":  # Text only: no tool calls, no reasoning.
        texts = [_TEXT for choice in _dicts_in(response, "choices") if type(choice.get("text")) is str and choice["text"]]
        return _facts((shape, [], None, finish_reason_of(response, shape), _numbered(texts) if operations else None,
                       _status(response)))
    if shape == "responses":
        calls = _responses_tool_calls(response)
        return _facts((shape, calls, _joined(_responses_reasoning(response)), finish_reason_of(response, shape),
                       _numbered([op for item in _items(response) if (op := _responses_operation(item))])
                       if operations else None, _status(response)))
    return _facts((shape, _messages_tool_calls(response), _joined(_messages_reasoning(response)),
                   finish_reason_of(response, shape),
                   _numbered([op for block in _blocks(response) if (op := _messages_operation(block))])
                   if operations else None, _status(response)))


def _status(response: dict[str, Any]) -> Optional[str]:
    """The response's ``status`` (Responses: completed, incomplete, failed, ...), whatever its shape."""
    status = response.get("status")
    return status if isinstance(status, str) else None


def _describe_chat(response: dict[str, Any], operations: bool) -> ResponseFacts:
    messages = _choice_messages(response)
    if len(messages) == 1:  # The common case, without building lists to join.
        message = messages[0]
        calls = _chat_tool_calls(message)
        reasoning = _chat_reasoning(message)
        numbered = _numbered(_chat_operations(message, reasoning, calls)) if operations else None
        return _facts(("chat", calls, reasoning, finish_reason_of(response, "chat"), numbered, _status(response)))
    calls, reasonings, steps = [], [], []
    for message in messages:
        message_calls = _chat_tool_calls(message)
        reasoning = _chat_reasoning(message)
        calls += message_calls
        if reasoning:
            reasonings.append(reasoning)
        if operations:
            steps += _chat_operations(message, reasoning, message_calls)
    return _facts(("chat", calls, _joined(reasonings), finish_reason_of(response, "chat"),
                   _numbered(steps) if operations else None, _status(response)))


_NO_FACTS = ResponseFacts()
#: A `ResponseFacts` from a tuple of all six, without the NamedTuple's Python-level ``__new__``.
_facts = partial(tuple.__new__, ResponseFacts)


#: 19 digits in a row: possibly an integer beyond 64 bits, which only Python's json keeps exact.
_LONG_NUMBER = re.compile(r"\d{19}")


def _as_arguments(arguments: Any) -> Any:
    """Tool arguments, exactly as NeMo Gym 0.7.0 reads them: an object as it is; a string parsed as
    JSON whatever it holds (``"[1]"`` gives ``[1]``), or ``{"_raw": text}`` when it is not JSON
    (the empty string included); any other value ``{}``."""
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        if _LONG_NUMBER.search(arguments) is None:
            try:
                return orjson.loads(arguments)
            except orjson.JSONDecodeError:
                pass
        # Python's json keeps integers beyond 64 bits exact (orjson makes them floats: vLLM
        # writes such arguments, docs/files.md), and takes NaN, Infinity and lone surrogates.
        try:
            return json.loads(arguments)
        except ValueError:
            return {"_raw": arguments}
    return {}


def _tool_calls_and_reasoning(response: dict[str, Any]) -> tuple[list[dict[str, Any]], Optional[str]]:
    """Structured tool calls (name, arguments, call_id) and reasoning text, across all three shapes."""
    facts = describe_response(response)
    return facts.tool_calls, facts.reasoning


def tool_calls_of(response: Any, shape: Optional[str]) -> list[dict[str, Any]]:
    """The tool calls of a response of ``shape`` (from `response_shape`), as `describe_response` gives them."""
    if shape == "chat":
        return [call for message in _choice_messages(response) for call in _chat_tool_calls(message)]
    if shape == "responses":
        return _responses_tool_calls(response)
    if shape == "messages":
        return _messages_tool_calls(response)
    return []


def finish_reason_of(response: Any, shape: Optional[str] = None) -> Optional[str]:
    """The first text among Anthropic ``stop_reason``, Chat ``choices[0].finish_reason`` and
    Responses ``incomplete_details.reason``, whatever the shape (a partial reply too), as NeMo Gym
    reads it. ``shape`` is accepted for callers that know it; the answer does not depend on it."""
    if not isinstance(response, dict):
        return None
    value = response.get("stop_reason")
    if isinstance(value, str):
        return value
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        value = choices[0].get("finish_reason")
        if isinstance(value, str):
            return value
    details = response.get("incomplete_details")
    value = details.get("reason") if isinstance(details, dict) else None
    return value if isinstance(value, str) else None


def tool_call_ids_if_well_formed(response: dict[str, Any]) -> Optional[frozenset[str]]:
    """The ids of every tool call the response requested, or None when its shape is malformed."""
    facts = describe_response(response)
    if facts.shape is None or (facts.shape == "chat" and _first_choice_message(response) is None):
        return None
    ids = [call.get("call_id") for call in facts.tool_calls]
    if any(not isinstance(call_id, str) or not call_id for call_id in ids):
        return None
    return frozenset(ids)  # type: ignore[arg-type]  # every id was checked a str just above


# -- Responses ---------------------------------------------------------------------------------

def _dicts_in(response: dict[str, Any], key: str) -> Iterator[dict[str, Any]]:
    """The objects of the list at ``response[key]`` (Responses ``output``, Anthropic ``content``)."""
    entries = response.get(key)
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict):
            yield entry


def _items(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return _dicts_in(response, "output")


def _responses_tool_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for item in _items(response):
        if item.get("type") == "function_call":  # A call without call_id is known by its item id (Gym).
            calls.append({"call_id": item.get("call_id") or item.get("id"), "name": item.get("name"),
                          "arguments": _as_arguments(item.get("arguments"))})
        elif item.get("type") == "custom_tool_call":
            calls.append({"call_id": item.get("call_id"), "name": item.get("name"), "arguments": _as_arguments(item.get("input"))})
    return calls


def _responses_reasoning(response: dict[str, Any]) -> list[str]:
    texts = []
    for item in _items(response):
        if item.get("type") != "reasoning":
            continue
        for key in ("summary", "content"):  # Summaries, then raw `reasoning_text` content.
            parts = item.get(key)
            for part in parts if isinstance(parts, list) else ():
                if isinstance(part, dict) and isinstance(part.get("text"), str) and part["text"]:
                    texts.append(part["text"])
    return texts


# -- Chat Completions --------------------------------------------------------------------------

def _choice_messages(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The message of every choice, in order (n > 1 gives several)."""
    return [choice["message"] for choice in response["choices"]
            if isinstance(choice, dict) and isinstance(choice.get("message"), dict)]


def _first_choice_message(response: dict[str, Any]) -> Optional[dict[str, Any]]:
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        return message if isinstance(message, dict) else None
    return None


def _chat_tool_calls(message: Optional[dict[str, Any]]) -> list[dict[str, Any]]:
    calls = []
    tool_calls = message.get("tool_calls") if message is not None else None
    if isinstance(tool_calls, list):
        for call in tool_calls:
            if isinstance(call, dict):
                function = call.get("function")
                if isinstance(function, dict):
                    name, arguments = function.get("name"), _as_arguments(function.get("arguments"))
                else:
                    name, arguments = None, {}
                calls.append({"call_id": call.get("id"), "name": name, "arguments": arguments})
    return calls


def _chat_reasoning(message: Optional[dict[str, Any]]) -> Optional[str]:
    """``reasoning_content`` (DeepSeek, older vLLM) or its alias ``reasoning`` (newer vLLM, OpenRouter)."""
    if message is None:
        return None
    value = message.get("reasoning_content")
    if isinstance(value, str) and value:
        return value
    value = message.get("reasoning")
    return value if isinstance(value, str) and value else None


# -- Anthropic Messages ------------------------------------------------------------------------

def _blocks(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    return _dicts_in(response, "content")


def _messages_tool_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"call_id": block.get("id"), "name": block.get("name"), "arguments": _as_arguments(block.get("input"))}
            for block in _blocks(response) if block.get("type") == "tool_use"]


def _messages_reasoning(response: dict[str, Any]) -> list[str]:
    return [block["thinking"] for block in _blocks(response)
            if block.get("type") == "thinking" and isinstance(block.get("thinking"), str) and block["thinking"]]


def _joined(texts: list[str]) -> Optional[str]:
    return "\n".join(texts) if texts else None


# -- Output items as operations ---------------------------------------------------------------

#: One operation before numbering: (kind, call_id, name, status), every value type-checked.
_Operation = tuple[str, Optional[str], Optional[str], Optional[str]]


def _numbered(operations: list[_Operation]) -> list[ModelOperationObservation]:
    """Number the operations in order."""
    numbered: list[ModelOperationObservation] = []
    append, shared = numbered.append, _SHARED_OPERATIONS
    for index, operation in enumerate(operations):
        if operation[1] is None:  # No call id: the same few recur in every record, so share them.
            key = (index, operation)
            observation = shared.get(key)
            if observation is None:
                observation = _observation(index, *operation)
                if len(shared) < 4096:
                    shared[key] = observation
            append(observation)
        else:
            append(_observation(index, *operation))
    return numbered


def _observation(index: int, kind: str, call_id: Optional[str], name: Optional[str],
                 status: Optional[str]) -> ModelOperationObservation:
    return construct_checked(ModelOperationObservation, {"index": index, "kind": kind, "call_id": call_id,
                                                         "name": name, "status": status}, _OPERATION_FIELDS)


#: Operations without a call id, by (index, operation); `ModelOperationObservation` is frozen.
_SHARED_OPERATIONS: dict[tuple[int, _Operation], ModelOperationObservation] = {}


def _operation(kind: str, call_id: Any = None, name: Any = None, status: Any = None) -> _Operation:
    """One `ModelOperationObservation` before numbering, every value type-checked."""
    return (kind, call_id if type(call_id) is str else None, name if type(name) is str else None,
            status if type(status) is str else None)


def _responses_operation(item: dict[str, Any]) -> Optional[_Operation]:
    kind = item.get("type")
    status = item.get("status")
    if kind == "message":
        parts: list[Any] = item["content"] if isinstance(item.get("content"), list) else []
        refused = any(isinstance(p, dict) and p.get("type") == "refusal" for p in parts)
        return _operation("refusal" if refused else "text", status=status)
    if kind == "reasoning":
        return _operation("reasoning", status=status)
    if kind in _RESPONSES_CLIENT_TOOL_ITEMS:
        return _operation("tool_call", item.get("call_id"), item.get("name"), status)
    if isinstance(kind, str) and kind.endswith("_call"):  # web_search_call, code_interpreter_call, ...
        return _operation("server_tool_call", item.get("id"), kind[: -len("_call")], status)
    return None


def _chat_operations(message: dict[str, Any], reasoning: Optional[str],
                     calls: list[dict[str, Any]]) -> list[_Operation]:
    operations: list[_Operation] = [_REASONING] if reasoning else []
    content = message.get("content")
    if type(content) is str and content:
        operations.append(_TEXT)
    refusal = message.get("refusal")
    if type(refusal) is str and refusal:
        operations.append(_REFUSAL)
    for call in calls:
        call_id, name = call["call_id"], call["name"]
        operations.append(("tool_call", call_id if type(call_id) is str else None, name if type(name) is str else None, None))
    return operations


_REASONING, _TEXT, _REFUSAL = _operation("reasoning"), _operation("text"), _operation("refusal")


def _messages_operation(block: dict[str, Any]) -> Optional[_Operation]:
    kind = block.get("type")
    if kind in ("thinking", "redacted_thinking"):
        return _operation("reasoning")
    if kind == "text":
        return _operation("text")
    if kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
        return _operation("tool_call" if kind == "tool_use" else "server_tool_call", block.get("id"), block.get("name"))
    return None  # Tool results are produced by the server, not the model.


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None
