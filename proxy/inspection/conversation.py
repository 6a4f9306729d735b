"""A captured call read as a conversation (issue 22): messages by role, tool calls with their
arguments, the tool results that answer them, reasoning apart from the answer, and the reply.

One function per dialect turns the request and the response into the same small shape, so the
report (and anything else) draws every dialect one way:

    {"request": [message, ...], "reply": [message, ...], "tools": [offered tool names]}
    message = {"role": str, "parts": [part, ...]}   (a reply message may carry "choice": n)
    part    = {"kind": "text" | "reasoning" | "tool_call" | "tool_result" | "media" | "other",
               "text": str, "name": str?, "call_id": str?}

Nothing here raises on a shape it does not know: an unknown item becomes an ``other`` part with
its JSON, so nothing captured is hidden from the reader. Texts are cut at `TEXT_LIMIT` (the
capture file keeps them whole).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import orjson

#: Characters of one text kept in a conversation part.
TEXT_LIMIT = 20_000

Part = dict[str, Any]
Message = dict[str, Any]


def conversation_of(line: dict[str, Any]) -> dict[str, Any]:
    """The call's request and reply as messages (see the module docstring)."""
    request = line["request"] if isinstance(line.get("request"), dict) else {}
    response = line["response"] if isinstance(line.get("response"), dict) else {}
    dialect = line.get("dialect")
    reader = _READERS.get(dialect if isinstance(dialect, str) else "", _guess_reader(request, response))
    messages, reply = reader(request, response)
    if not reply and response:  # An error body, or a shape none of the dialects has: shown as it is.
        reply = [{"role": "error" if "error" in response else "response", "parts": [_part("other", response)]}]
    names = {part["call_id"]: part.get("name") for m in messages + reply for part in m["parts"]
             if part["kind"] == "tool_call" and part.get("call_id")}
    for message in messages:  # A tool result names the call it answers.
        for part in message["parts"]:
            if part["kind"] == "tool_result" and part.get("call_id") in names and not part.get("name"):
                part["name"] = names[part["call_id"]]
    return {"request": messages, "reply": reply, "tools": _offered_tools(request)}


def reply_text(line: dict[str, Any]) -> Optional[str]:
    """The reply's answer text (no reasoning, no tool calls), choices joined by blank lines; None when it has none."""
    reply = conversation_of(line)["reply"]
    texts = [part["text"] for message in reply for part in message["parts"] if part["kind"] == "text"]
    return "\n\n".join(texts) if texts else None


def _cut(text: Any) -> str:
    if not isinstance(text, str):
        text = _json(text)
    if len(text) <= TEXT_LIMIT:
        return text
    return text[:TEXT_LIMIT] + f"\n... ({len(text) - TEXT_LIMIT:,} more characters in the capture file)"


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    except TypeError:
        return str(value)


def _part(kind: str, text: Any, **extra: Any) -> Part:
    return {"kind": kind, "text": _cut(text if text is not None else ""),
            **{k: str(v) for k, v in extra.items() if v is not None}}


def _arguments(value: Any) -> str:
    """Tool arguments pretty-printed when they are JSON (as text or already parsed)."""
    if isinstance(value, str):
        try:
            return _json(orjson.loads(value))
        except orjson.JSONDecodeError:
            return value
    return _json(value)


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _offered_tools(request: dict[str, Any]) -> list[str]:
    names = []
    for tool in _dicts(request.get("tools")):
        function = tool["function"] if isinstance(tool.get("function"), dict) else tool
        name = function.get("name") or tool.get("type")
        if isinstance(name, str):
            names.append(name)
    return names


# -- content pieces shared by the OpenAI shapes ------------------------------------------------

def _openai_content(content: Any) -> list[Part]:
    """A chat or Responses message's ``content``: a string, or a list of typed parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [_part("text", content)]
    parts = []
    for piece in content if isinstance(content, list) else [content]:
        if isinstance(piece, str):
            parts.append(_part("text", piece))
        elif not isinstance(piece, dict):
            parts.append(_part("other", piece))
        elif isinstance(piece.get("text"), str):
            kind = "reasoning" if piece.get("type") in ("reasoning_text", "summary_text") else "text"
            parts.append(_part(kind, piece["text"]))
        elif piece.get("type") == "refusal":
            parts.append(_part("text", "(refusal) " + str(piece.get("refusal"))))
        elif piece.get("type") in ("image_url", "input_image", "input_audio", "input_file", "file", "image"):
            parts.append(_part("media", f"[{piece.get('type')}]"))
        else:
            parts.append(_part("other", piece))
    return parts


# -- Chat Completions ---------------------------------------------------------------------------

def _chat_message(message: dict[str, Any]) -> Message:
    role = str(message.get("role") or "?")
    parts: list[Part] = []
    for key in ("reasoning_content", "reasoning"):
        if isinstance(message.get(key), str) and message[key]:
            parts.append(_part("reasoning", message[key]))
            break
    if role == "tool":
        parts.append(_part("tool_result", _plain(message.get("content")), call_id=message.get("tool_call_id"),
                           name=message.get("name")))
    else:
        parts.extend(_openai_content(message.get("content")))
    if isinstance(message.get("refusal"), str):
        parts.append(_part("text", "(refusal) " + message["refusal"]))
    for call in _dicts(message.get("tool_calls")):
        function = call["function"] if isinstance(call.get("function"), dict) else {}
        parts.append(_part("tool_call", _arguments(function.get("arguments")), name=function.get("name"),
                           call_id=call.get("id")))
    return {"role": role, "parts": parts}


def _plain(content: Any) -> str:
    """A tool result's content as text (a string, or the texts of its parts)."""
    if isinstance(content, str):
        return content
    texts = [piece["text"] for piece in _dicts(content) if isinstance(piece.get("text"), str)]
    return "\n".join(texts) if texts else _json(content)


def _chat(request: dict[str, Any], response: dict[str, Any]) -> tuple[list[Message], list[Message]]:
    messages = [_chat_message(m) for m in _dicts(request.get("messages"))]
    reply = []
    for number, choice in enumerate(_dicts(response.get("choices"))):
        message = choice["message"] if isinstance(choice.get("message"), dict) else {}
        reply.append({**_chat_message({"role": "assistant", **message}), "choice": choice.get("index", number)})
    return messages, reply


# -- Completions --------------------------------------------------------------------------------

def _completions(request: dict[str, Any], response: dict[str, Any]) -> tuple[list[Message], list[Message]]:
    prompt = request.get("prompt")
    prompts = prompt if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt) else [prompt]
    messages = [{"role": "prompt", "parts": [_part("text" if isinstance(p, str) else "other", p)]}
                for p in prompts if p is not None]
    reply = [{"role": "completion", "choice": choice.get("index", number), "parts": [_part("text", choice.get("text"))]}
             for number, choice in enumerate(_dicts(response.get("choices")))]
    return messages, reply


# -- Responses ----------------------------------------------------------------------------------

def _responses_items(items: Any) -> list[Message]:
    """Responses input or output items as messages: consecutive non-message items (reasoning,
    tool calls) of the model are gathered into one assistant message."""
    if isinstance(items, str):
        return [{"role": "user", "parts": [_part("text", items)]}]
    messages: list[Message] = []

    def assistant() -> Message:
        if not messages or messages[-1]["role"] != "assistant":
            messages.append({"role": "assistant", "parts": []})
        return messages[-1]

    for item in _dicts(items):
        kind = item.get("type")
        if kind in (None, "message") and "role" in item:
            role = str(item.get("role"))
            if role == "assistant":
                assistant()["parts"].extend(_openai_content(item.get("content")))
            else:
                messages.append({"role": role, "parts": _openai_content(item.get("content"))})
        elif kind == "reasoning":
            texts = [s["text"] for s in _dicts(item.get("summary")) + _dicts(item.get("content"))
                     if isinstance(s.get("text"), str)]
            if texts:
                assistant()["parts"].append(_part("reasoning", "\n\n".join(texts)))
        elif kind in ("function_call", "custom_tool_call"):
            arguments = item.get("arguments") if kind == "function_call" else item.get("input")
            assistant()["parts"].append(_part("tool_call", _arguments(arguments), name=item.get("name"),
                                              call_id=item.get("call_id")))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append({"role": "tool", "parts": [_part("tool_result", _plain(item.get("output")),
                                                             call_id=item.get("call_id"))]})
        else:
            assistant()["parts"].append(_part("other", item))
    return messages


def _responses(request: dict[str, Any], response: dict[str, Any]) -> tuple[list[Message], list[Message]]:
    messages = []
    if isinstance(request.get("instructions"), str):
        messages.append({"role": "system", "parts": [_part("text", request["instructions"])]})
    messages.extend(_responses_items(request.get("input")))
    reply = _responses_items(response.get("output"))
    return messages, reply


# -- Anthropic Messages -------------------------------------------------------------------------

def _anthropic_blocks(content: Any) -> list[Part]:
    if isinstance(content, str):
        return [_part("text", content)]
    parts = []
    for block in _dicts(content):
        kind = block.get("type")
        if kind == "text":
            parts.append(_part("text", block.get("text")))
        elif kind == "thinking":
            parts.append(_part("reasoning", block.get("thinking")))
        elif kind == "redacted_thinking":
            parts.append(_part("reasoning", "(redacted thinking)"))
        elif kind in ("tool_use", "server_tool_use"):
            parts.append(_part("tool_call", _arguments(block.get("input")), name=block.get("name"), call_id=block.get("id")))
        elif kind == "tool_result" or (isinstance(kind, str) and kind.endswith("_tool_result")):
            text = _plain(block.get("content"))
            parts.append(_part("tool_result", ("(error) " if block.get("is_error") else "") + text,
                               call_id=block.get("tool_use_id")))
        elif kind in ("image", "document"):
            parts.append(_part("media", f"[{kind}]"))
        else:
            parts.append(_part("other", block))
    return parts


def _messages(request: dict[str, Any], response: dict[str, Any]) -> tuple[list[Message], list[Message]]:
    messages = []
    system = request.get("system")
    if system:
        messages.append({"role": "system", "parts": _anthropic_blocks(system)})
    for message in _dicts(request.get("messages")):
        messages.append({"role": str(message.get("role") or "?"), "parts": _anthropic_blocks(message.get("content"))})
    reply = [{"role": "assistant", "parts": _anthropic_blocks(response.get("content"))}] if response.get("content") else []
    return messages, reply


_Reader = Callable[[dict[str, Any], dict[str, Any]], tuple[list[Message], list[Message]]]
_READERS: dict[str, _Reader] = {"chat": _chat, "completions": _completions, "responses": _responses,
                                "messages": _messages}


def _guess_reader(request: dict[str, Any], response: dict[str, Any]) -> _Reader:
    """For a line without a dialect (an older or hand-written capture): read the request's shape."""
    if "input" in request or "instructions" in request:
        return _responses
    if "prompt" in request:
        return _completions
    if isinstance(request.get("system"), (str, list)) or response.get("type") == "message":
        return _messages
    return _chat
