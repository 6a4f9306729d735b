"""The conformance oracle (docs/files.md): what the official SDKs accumulate from the same stream bytes.

Each ``sdk_*`` function feeds the byte pieces to the SDK's own SSE decoder and stream accumulator,
the way the SDK's ``Stream`` does, and returns a normalised view -- or `SdkGaveUp` when the SDK
cannot finish (it raises on the stream, or never produces a final object). The ``ours_*``
functions give the same view of our reassembly, so the two compare with ``==``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from anthropic._streaming import SSEDecoder as AnthropicSSEDecoder
from anthropic.lib.streaming._messages import accumulate_event
from openai import omit
from openai._models import construct_type
from openai._streaming import SSEDecoder as OpenAISSEDecoder
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent


@dataclass(frozen=True)
class SdkGaveUp:
    """The SDK could not produce a final object from this stream; ``why`` says what it did.

    ``partial`` is the view of what the SDK held when it stopped (its snapshot, or for Responses
    the response carried by a `response.incomplete` / `response.failed` terminal), if anything.
    """

    why: str
    partial: dict[str, Any] | None = None


def _parsed(arguments: Any) -> Any:
    if isinstance(arguments, (dict, list)):
        return arguments
    try:
        return orjson.loads(arguments) if arguments else {}
    except (orjson.JSONDecodeError, TypeError):
        return {"_raw": arguments}


def _plain(value: Any) -> Any:
    """A model or dict as plain JSON-like data, without the None fields SDK models add."""
    if hasattr(value, "to_dict"):
        value = value.to_dict(warnings=False)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):  # Our reassembly keeps logprob bytes as tuples: the same JSON.
        return [_plain(v) for v in value]
    return value


# -- Chat Completions -------------------------------------------------------------------------

def sdk_chat(pieces: list[bytes]) -> dict[str, Any] | SdkGaveUp:
    state = ChatCompletionStreamState()
    seen = False
    for sse in OpenAISSEDecoder().iter_bytes(iter(pieces)):
        if sse.data.startswith("[DONE]"):
            break
        data = sse.json()
        if isinstance(data, dict) and data.get("error"):
            return SdkGaveUp("raises APIError on the in-stream error",
                             chat_view(_plain(state.current_completion_snapshot)) if seen else None)
        state.handle_chunk(construct_type(type_=ChatCompletionChunk, value=data))
        seen = True
    if not seen:
        return SdkGaveUp("no chunk")
    return chat_view(_plain(state.current_completion_snapshot))


def chat_view(completion: dict[str, Any]) -> dict[str, Any]:
    """Per choice index: text, refusal, reasoning, tool calls, finish reason, logprobs; and usage."""
    choices = {}
    for choice in completion.get("choices") or []:
        message = choice.get("message") or {}
        choices[choice["index"]] = {
            "content": message.get("content") or None,
            "refusal": message.get("refusal") or None,
            "reasoning_content": message.get("reasoning_content") or None,
            "reasoning": message.get("reasoning") or None,
            "tool_calls": [(call.get("id"), call["function"].get("name"), _parsed(call["function"].get("arguments")))
                           for call in message.get("tool_calls") or []],
            "finish_reason": choice.get("finish_reason"),
            # Whole entries (token, logprob, bytes, top_logprobs), for content and refusal alike.
            "logprobs": {key: _plain((choice.get("logprobs") or {}).get(key)) or None for key in ("content", "refusal")},
        }
    return {"choices": choices, "usage": _plain(completion.get("usage"))}


# -- Responses --------------------------------------------------------------------------------

def sdk_responses(pieces: list[bytes]) -> dict[str, Any] | SdkGaveUp:
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    for sse in OpenAISSEDecoder().iter_bytes(iter(pieces)):
        if sse.data.startswith("[DONE]"):
            break
        data = sse.json()
        try:
            state.handle_event(construct_type(type_=ResponseStreamEvent, value=data))  # type: ignore[arg-type]
        except RuntimeError as exc:
            return SdkGaveUp(f"raises RuntimeError: {exc}")
        if state._completed_response is not None:  # The final response the SDK's stream returns.
            return responses_view(_plain(state._completed_response))
        if data.get("type") in ("response.incomplete", "response.failed"):
            return SdkGaveUp(f"ends on {data['type']} without a final response", responses_view(data["response"]))
    return SdkGaveUp("no response.completed event")


def responses_view(response: dict[str, Any]) -> dict[str, Any]:
    """Status, each output item's kind, id, text / refusal / reasoning / call fields, and usage."""
    items = []
    for item in response.get("output") or []:
        view: dict[str, Any] = {"type": item.get("type"), "id": item.get("id")}
        parts = item.get("content") or []
        view["text"] = [p.get("text") for p in parts if p.get("type") in ("output_text", "reasoning_text")]
        view["refusal"] = [p.get("refusal") for p in parts if p.get("type") == "refusal"]
        view["summary"] = [p.get("text") for p in item.get("summary") or []]
        if item.get("type") in ("function_call", "custom_tool_call"):
            payload = item.get("arguments") if item.get("type") == "function_call" else item.get("input")
            view["call"] = (item.get("call_id"), item.get("name"), _parsed(payload) if item.get("type") == "function_call" else payload)
        items.append(view)
    return {"status": response.get("status"), "output": items, "usage": _plain(response.get("usage")),
            "incomplete_details": _plain(response.get("incomplete_details"))}


# -- Anthropic Messages -----------------------------------------------------------------------

_MESSAGE_EVENTS = {"message_start", "message_delta", "message_stop", "content_block_start", "content_block_delta", "content_block_stop"}


def sdk_messages(pieces: list[bytes]) -> dict[str, Any] | SdkGaveUp:
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for sse in AnthropicSSEDecoder().iter_bytes(iter(pieces)):
        if sse.event == "error":
            return SdkGaveUp("raises the stream's error event", messages_view(_plain(snapshot)) if snapshot else None)
        if sse.event in _MESSAGE_EVENTS and sse.data:
            try:
                snapshot = accumulate_event(event=sse.json(), current_snapshot=snapshot, json_bufs=json_bufs)
            except (RuntimeError, ValueError) as exc:
                return SdkGaveUp(f"raises {type(exc).__name__}: {exc}")
    if snapshot is None:
        return SdkGaveUp("no message_start")
    return messages_view(_plain(snapshot))


def messages_view(message: dict[str, Any]) -> dict[str, Any]:
    """Each content block's kind and text / thinking / signature / tool input / citations; stop and usage."""
    blocks = []
    for block in message.get("content") or []:
        view = {key: block.get(key) for key in ("type", "text", "thinking", "signature", "data", "id", "name")}
        if "input" in block:
            view["input"] = block.get("input")
        view["citations"] = _plain(block.get("citations")) or None
        blocks.append(view)
    return {"content": blocks, "stop_reason": message.get("stop_reason"), "stop_sequence": message.get("stop_sequence"),
            "usage": _plain(message.get("usage"))}


SDK_ORACLES = {"chat": sdk_chat, "responses": sdk_responses, "messages": sdk_messages}
VIEWS = {"chat": chat_view, "responses": responses_view, "messages": messages_view}
