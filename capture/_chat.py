"""Reassembly of an OpenAI Chat Completions stream (DESIGN §6).

Follows openai-python's ``ChatCompletionStreamState``: one choice per ``index`` (n > 1 kept
apart), content / refusal / reasoning appended, tool calls merged by their ``index``, logprobs
concatenated, ``usage`` from whichever chunk carries it, ``data: [DONE]`` as the terminal. vLLM's
extra fields are tolerated; a chunk with ``error`` (vLLM's in-stream failure) is an error.
"""

from __future__ import annotations

from typing import Any

from ._reassembler import Reassembler, grow_list
from ._sse import ServerSentEvent

_ENVELOPE_KEYS = ("id", "created", "model", "system_fingerprint", "service_tier")
# Text fields of a delta that are concatenated; reasoning arrives as either name (DESIGN §10).
_TEXT_KEYS = ("content", "refusal", "reasoning_content", "reasoning")


class ChatReassembler(Reassembler):
    dialect = "chat"

    def __init__(self) -> None:
        super().__init__()
        self._envelope: dict[str, Any] = {}
        self._choices: list[dict[str, Any] | None] = []
        self._usage: Any = None
        self._error: Any = None

    def result(self) -> dict[str, Any] | None:
        if not self._envelope and not self._choices and self._error is None:
            return None
        completion: dict[str, Any] = {"object": "chat.completion", **self._envelope}
        completion["choices"] = [choice for choice in self._choices if choice is not None]
        if self._usage is not None:
            completion["usage"] = self._usage
        if self._error is not None:
            completion["error"] = self._error
        return completion

    def _on_undecodable(self, event: ServerSentEvent) -> None:
        if event.data.strip() == "[DONE]":
            self.terminal = True
        super()._on_undecodable(event)

    def _on_payload(self, event_type: str, payload: dict[str, Any]) -> None:
        if payload.get("error") is not None:
            self.error_category = "upstream_error"
            self._error = payload["error"]
            return
        for key in _ENVELOPE_KEYS:
            if key not in self._envelope and payload.get(key) is not None:
                self._envelope[key] = payload[key]
        if payload.get("usage") is not None:
            self._usage = payload["usage"]
        choices = payload.get("choices")
        for chunk_choice in choices if isinstance(choices, list) else ():
            if isinstance(chunk_choice, dict):
                self._on_choice(chunk_choice)

    def _on_choice(self, chunk_choice: dict[str, Any]) -> None:
        index = chunk_choice.get("index", 0)
        if not grow_list(self._choices, index):
            return
        choice = self._choices[index]
        if choice is None:
            choice = {"index": index, "message": {"role": "assistant", "content": None}, "finish_reason": None, "logprobs": None}
            self._choices[index] = choice
        delta = chunk_choice.get("delta")
        if isinstance(delta, dict):
            _merge_delta(choice["message"], delta)
        if chunk_choice.get("finish_reason") is not None:
            choice["finish_reason"] = chunk_choice["finish_reason"]
        if isinstance(chunk_choice.get("logprobs"), dict):
            choice["logprobs"] = _merge_logprobs(choice["logprobs"], chunk_choice["logprobs"])


def _merge_delta(message: dict[str, Any], delta: dict[str, Any]) -> None:
    if isinstance(delta.get("role"), str):
        message["role"] = delta["role"]
    for key in _TEXT_KEYS:
        piece = delta.get(key)
        if isinstance(piece, str):
            current = message.get(key)
            message[key] = (current if isinstance(current, str) else "") + piece
    tool_calls = delta.get("tool_calls")
    for fragment in tool_calls if isinstance(tool_calls, list) else ():
        if isinstance(fragment, dict):
            _merge_tool_call(message.setdefault("tool_calls", []), fragment)


def _merge_tool_call(calls: list[Any], fragment: dict[str, Any]) -> None:
    """Fragments of one call share an ``index``; id, type and name arrive once, arguments in pieces."""
    index = fragment.get("index", len(calls))
    if not grow_list(calls, index):
        return
    call = calls[index]
    if call is None:
        call = calls[index] = {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    for key in ("id", "type"):
        if isinstance(fragment.get(key), str) and fragment[key]:
            call[key] = fragment[key]
    function = fragment.get("function")
    if isinstance(function, dict):
        for key in ("name", "arguments"):
            if isinstance(function.get(key), str):
                call["function"][key] += function[key]


def _merge_logprobs(current: dict[str, Any] | None, chunk: dict[str, Any]) -> dict[str, Any]:
    merged = dict(current or {})
    for key in ("content", "refusal"):
        entries = chunk.get(key)
        if isinstance(entries, list):
            merged[key] = (merged.get(key) or []) + entries
        else:
            merged.setdefault(key, None)
    return merged
