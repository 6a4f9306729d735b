"""Reading the three response shapes: tool calls, reasoning, output items, finish reason (DESIGN §7).

Responses (``object: "response"``, ``output`` items), Chat Completions (``choices[0].message``)
and Anthropic Messages (``content`` blocks). Every function tolerates malformed input: a shape
it does not recognise yields nothing rather than an exception.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import orjson

# Responses output item types the model produces for server-side (built-in) tools.
_RESPONSES_CLIENT_TOOL_ITEMS = ("function_call", "custom_tool_call")


def response_shape(response: Any) -> Optional[str]:
    """``responses``, ``chat`` or ``messages`` for a response object of that shape, else None."""
    if not isinstance(response, dict):
        return None
    if response.get("object") == "response" or isinstance(response.get("output"), list):
        return "responses"
    if isinstance(response.get("choices"), list):
        return "chat"
    if response.get("type") == "message" or isinstance(response.get("content"), list):
        return "messages"
    return None


def _as_arguments(arguments: Any) -> dict[str, Any]:
    """Tool arguments as an object: JSON text parsed, anything unparseable kept as ``{"_raw": text}``."""
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, (str, bytes)):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return {"_raw": arguments if isinstance(arguments, str) else arguments.decode("utf-8", "replace")}
        return parsed if isinstance(parsed, dict) else {"_raw": arguments}
    return {"_raw": arguments}


def _tool_calls_and_reasoning(response: dict[str, Any]) -> tuple[list[dict[str, Any]], Optional[str]]:
    """Structured tool calls (name, arguments, call_id) and reasoning text, across all three shapes."""
    shape = response_shape(response)
    if shape == "responses":
        return _responses_tool_calls(response), _joined(_responses_reasoning(response))
    if shape == "chat":
        message = _first_choice_message(response)
        return _chat_tool_calls(message), _chat_reasoning(message)
    if shape == "messages":
        return _messages_tool_calls(response), _joined(_messages_reasoning(response))
    return [], None


def finish_reason_of(response: Any) -> Optional[str]:
    """Anthropic ``stop_reason``, Chat ``choices[0].finish_reason``, Responses ``incomplete_details.reason``."""
    shape = response_shape(response)
    if shape == "messages":
        value = response.get("stop_reason")
    elif shape == "chat":
        choices = response["choices"]
        value = choices[0].get("finish_reason") if choices and isinstance(choices[0], dict) else None
    elif shape == "responses":
        details = response.get("incomplete_details")
        value = details.get("reason") if isinstance(details, dict) else None
    else:
        value = None
    return value if isinstance(value, str) else None


def tool_call_ids_if_well_formed(response: dict[str, Any]) -> Optional[frozenset[str]]:
    """The ids of every tool call the response requested, or None when its shape is malformed."""
    shape = response_shape(response)
    if shape is None:
        return None
    calls, _ = _tool_calls_and_reasoning(response)
    ids = [call.get("call_id") for call in calls]
    if any(not isinstance(call_id, str) or not call_id for call_id in ids):
        return None
    if shape == "chat" and _first_choice_message(response) is None:
        return None
    return frozenset(ids)  # type: ignore[arg-type]


# -- Responses ---------------------------------------------------------------------------------

def _items(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    output = response.get("output")
    for item in output if isinstance(output, list) else ():
        if isinstance(item, dict):
            yield item


def _responses_tool_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for item in _items(response):
        if item.get("type") == "function_call":
            calls.append({"call_id": item.get("call_id"), "name": item.get("name"), "arguments": _as_arguments(item.get("arguments"))})
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

def _first_choice_message(response: dict[str, Any]) -> Optional[dict[str, Any]]:
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        return message if isinstance(message, dict) else None
    return None


def _chat_tool_calls(message: Optional[dict[str, Any]]) -> list[dict[str, Any]]:
    calls = []
    tool_calls = (message or {}).get("tool_calls")
    for call in tool_calls if isinstance(tool_calls, list) else ():
        if isinstance(call, dict):
            function = call.get("function") if isinstance(call.get("function"), dict) else {}
            calls.append({"call_id": call.get("id"), "name": function.get("name"), "arguments": _as_arguments(function.get("arguments"))})
    return calls


def _chat_reasoning(message: Optional[dict[str, Any]]) -> Optional[str]:
    """``reasoning_content`` (DeepSeek, older vLLM) or its alias ``reasoning`` (newer vLLM, OpenRouter)."""
    for key in ("reasoning_content", "reasoning"):
        value = (message or {}).get(key)
        if isinstance(value, str) and value:
            return value
    return None


# -- Anthropic Messages ------------------------------------------------------------------------

def _blocks(response: dict[str, Any]) -> Iterator[dict[str, Any]]:
    content = response.get("content")
    for block in content if isinstance(content, list) else ():
        if isinstance(block, dict):
            yield block


def _messages_tool_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"call_id": block.get("id"), "name": block.get("name"), "arguments": _as_arguments(block.get("input"))}
            for block in _blocks(response) if block.get("type") == "tool_use"]


def _messages_reasoning(response: dict[str, Any]) -> list[str]:
    return [block["thinking"] for block in _blocks(response)
            if block.get("type") == "thinking" and isinstance(block.get("thinking"), str) and block["thinking"]]


def _joined(texts: list[str]) -> Optional[str]:
    return "\n".join(texts) if texts else None


# -- Output items as operations ---------------------------------------------------------------

def model_operations(response: Any) -> Optional[list[dict[str, Any]]]:
    """One ``{index, kind, call_id, name, status}`` per output item the model produced, in order."""
    shape = response_shape(response)
    if shape == "responses":
        operations = [_responses_operation(item) for item in _items(response)]
    elif shape == "chat":
        operations = _chat_operations(_first_choice_message(response))
    elif shape == "messages":
        operations = [_messages_operation(block) for block in _blocks(response)]
    else:
        return None
    kept = [operation for operation in operations if operation is not None]
    return [{"index": index, **operation} for index, operation in enumerate(kept)]


def _responses_operation(item: dict[str, Any]) -> Optional[dict[str, Any]]:
    kind = item.get("type")
    status = item.get("status") if isinstance(item.get("status"), str) else None
    if kind == "message":
        parts = item.get("content") if isinstance(item.get("content"), list) else []
        refused = any(isinstance(p, dict) and p.get("type") == "refusal" for p in parts)
        return {"kind": "refusal" if refused else "text", "call_id": None, "name": None, "status": status}
    if kind == "reasoning":
        return {"kind": "reasoning", "call_id": None, "name": None, "status": status}
    if kind in _RESPONSES_CLIENT_TOOL_ITEMS:
        return {"kind": "tool_call", "call_id": _str(item.get("call_id")), "name": _str(item.get("name")), "status": status}
    if isinstance(kind, str) and kind.endswith("_call"):  # web_search_call, code_interpreter_call, ...
        return {"kind": "server_tool_call", "call_id": _str(item.get("id")), "name": kind[: -len("_call")], "status": status}
    return None


def _chat_operations(message: Optional[dict[str, Any]]) -> list[Optional[dict[str, Any]]]:
    if message is None:
        return []
    operations: list[Optional[dict[str, Any]]] = []
    if _chat_reasoning(message):
        operations.append({"kind": "reasoning", "call_id": None, "name": None, "status": None})
    for kind, key in (("text", "content"), ("refusal", "refusal")):
        if isinstance(message.get(key), str) and message[key]:
            operations.append({"kind": kind, "call_id": None, "name": None, "status": None})
    for call in _chat_tool_calls(message):
        operations.append({"kind": "tool_call", "call_id": _str(call["call_id"]), "name": _str(call["name"]), "status": None})
    return operations


def _messages_operation(block: dict[str, Any]) -> Optional[dict[str, Any]]:
    kind = block.get("type")
    if kind in ("thinking", "redacted_thinking"):
        return {"kind": "reasoning", "call_id": None, "name": None, "status": None}
    if kind == "text":
        return {"kind": "text", "call_id": None, "name": None, "status": None}
    if kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
        operation_kind = "tool_call" if kind == "tool_use" else "server_tool_call"
        return {"kind": operation_kind, "call_id": _str(block.get("id")), "name": _str(block.get("name")), "status": None}
    return None  # Tool results are produced by the server, not the model.


def _str(value: Any) -> Optional[str]:
    return value if isinstance(value, str) else None
