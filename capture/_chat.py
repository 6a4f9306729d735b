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
_TEXT_KEYS = frozenset({"content", "refusal", "reasoning_content", "reasoning"})


class ChatReassembler(Reassembler):
    dialect = "chat"

    def __init__(self) -> None:
        super().__init__()
        self._envelope: dict[str, Any] = {}
        self._envelope_missing = _ENVELOPE_KEYS
        self._choices: list[dict[str, Any] | None] = []
        self._usage: Any = None
        self._error: Any = None

    def result(self) -> dict[str, Any] | None:
        if not self._envelope and not self._choices and self._error is None:
            return None
        self.join_texts()
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
        if self._envelope_missing:
            self._fill_envelope(payload)
        usage = payload.get("usage")
        if usage is not None:
            self._usage = usage
        choices = payload.get("choices")
        if type(choices) is list:
            for chunk_choice in choices:
                if type(chunk_choice) is dict:
                    self._on_choice(chunk_choice)

    def _fill_envelope(self, payload: dict[str, Any]) -> None:
        """id, created, model, ... from the first chunk with an id (the SDK snapshots the first chunk)."""
        for key in _ENVELOPE_KEYS:
            if payload.get(key) is not None:
                self._envelope[key] = payload[key]
        if "id" in self._envelope:
            self._envelope_missing = ()

    def _on_choice(self, chunk_choice: dict[str, Any]) -> None:
        index = chunk_choice.get("index", 0)
        choices = self._choices
        choice = choices[index] if type(index) is int and 0 <= index < len(choices) else None
        if choice is None:
            if not grow_list(choices, index):
                return
            choice = choices[index] = {"index": index, "message": {"role": "assistant", "content": None},
                                       "finish_reason": None, "logprobs": None}
        delta = chunk_choice.get("delta")
        if type(delta) is dict and delta:
            self._merge_delta(choice["message"], delta)
        finish_reason = chunk_choice.get("finish_reason")
        if finish_reason is not None:
            choice["finish_reason"] = finish_reason
        logprobs = chunk_choice.get("logprobs")
        if type(logprobs) is dict:
            choice["logprobs"] = _merge_logprobs(choice["logprobs"], logprobs)


    def _merge_delta(self, message: dict[str, Any], delta: dict[str, Any]) -> None:
        for key, piece in delta.items():
            if key in _TEXT_KEYS:
                if type(piece) is str:
                    self.append_text(message, key, piece)
            elif key == "role":
                if type(piece) is str:
                    message["role"] = piece
            elif key == "tool_calls" and type(piece) is list:
                for fragment in piece:
                    if type(fragment) is dict:
                        self._merge_tool_call(message.setdefault("tool_calls", []), fragment)

    def _merge_tool_call(self, calls: list[Any], fragment: dict[str, Any]) -> None:
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
                    self.append_text(call["function"], key, function[key])


def _merge_logprobs(current: dict[str, Any] | None, chunk: dict[str, Any]) -> dict[str, Any]:
    merged = dict(current or {})
    for key in ("content", "refusal"):
        entries = chunk.get(key)
        if isinstance(entries, list):
            merged[key] = (merged.get(key) or []) + entries
        else:
            merged.setdefault(key, None)
    return merged
