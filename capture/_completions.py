"""Reassembly of an OpenAI (legacy) Completions stream, ``POST /v1/completions`` (docs/wire.md, docs/files.md).

The dialect token-in/token-out RL harnesses use: the prompt is text, a list of texts or token
ids. A stream is ``text_completion`` chunks, one choice per ``index`` (n > 1 and several prompts
kept apart), ending with ``data: [DONE]``. Per choice: ``text`` appended; ``logprobs`` in the
completions shape (parallel lists ``tokens``, ``token_logprobs``, ``text_offset``,
``top_logprobs``) concatenated list by list; ``finish_reason`` the last non-null. vLLM adds
``token_ids`` (concatenated, as chat) and ``prompt_token_ids`` / ``prompt_logprobs`` (on the first
chunk of each choice: the last non-null wins, never concatenated). Other fields follow chat's
`merge_unknown` rule. A chunk with ``error`` ends the reply as an error, as in chat.
"""

from __future__ import annotations

from typing import Any

from ._chat import TokenArrays, choices_reply, merge_unknown
from ._reassembler import Reassembler, grow_list

_ENVELOPE_KEYS = ("id", "created", "model", "system_fingerprint")
_KNOWN_CHUNK_KEYS = frozenset({*_ENVELOPE_KEYS, "object", "choices", "usage", "error"})
#: A choice's fields that describe the prompt, not a piece of the generation.
_WHOLE_CHOICE_KEYS = frozenset({"prompt_token_ids", "prompt_logprobs"})
#: The parallel per-token lists of a choice's ``logprobs`` (the completions shape).
_LOGPROB_LISTS = ("text_offset", "token_logprobs", "tokens", "top_logprobs")


class CompletionsReassembler(Reassembler):
    done_is_terminal = True
    dialect = "completions"
    #: The reply's ``object`` (None: the dialect names none), the top-level keys taken from the first
    #: chunk that has them, and those handled here rather than by the `merge_unknown` rule.
    reply_object: str | None = "text_completion"
    envelope_keys: tuple[str, ...] = _ENVELOPE_KEYS
    known_chunk_keys: frozenset[str] = _KNOWN_CHUNK_KEYS

    def __init__(self) -> None:
        super().__init__()
        self._envelope: dict[str, Any] = {}
        self._extras: dict[str, Any] = {}
        self._choices: list[dict[str, Any] | None] = []
        self._usage: Any = None
        self._error: Any = None
        self._arrays: dict[int, TokenArrays] = {}

    def _arrays_of(self, index: int) -> TokenArrays:
        return self._arrays.get(index) or self._arrays.setdefault(index, TokenArrays())

    def seen_whole(self) -> bool:
        return self._choices_seen_whole(self._choices, self._usage, self._error)

    def result(self) -> dict[str, Any] | None:
        if not self._envelope and not self._choices and self._error is None:
            return None
        self.join_texts()
        return choices_reply(self.reply_object, self._envelope, self._choices, self._arrays, self.compact_arrays,
                             self._usage, self._extras, self._error)

    def _on_payload(self, event_type: str, payload: dict[str, Any]) -> None:
        for key in self.envelope_keys:
            if key not in self._envelope and payload.get(key) is not None:
                self._envelope[key] = payload[key]
        if payload.get("usage") is not None:
            self._usage = payload["usage"]
        choices = payload.get("choices")
        if type(choices) is list:
            for chunk_choice in choices:
                if type(chunk_choice) is dict:
                    self._on_choice(chunk_choice)
        known = self.known_chunk_keys
        for key, value in payload.items():
            if key not in known and (value is not None or key not in self._extras):
                self._extras[key] = value
        if payload.get("error") is not None:  # As in chat: the error event ends the reply.
            self.error_category = "upstream_error"
            self._error = payload["error"]
            self.terminal = True
        elif self.ends_when_whole:
            self._ended_if_whole()

    def _on_choice(self, chunk_choice: dict[str, Any]) -> None:
        index = chunk_choice.get("index", 0)
        choices = self._choices
        if not grow_list(choices, index):
            return
        choice = choices[index]
        if choice is None:
            choice = choices[index] = {"index": index, "text": "", "logprobs": None, "finish_reason": None}
        for key, value in chunk_choice.items():
            if key == "index":
                continue
            if key == "text":
                if type(value) is str and value:
                    self.append_text(choice, "text", value)
            elif key == "logprobs":
                if type(value) is dict:
                    choice["logprobs"] = self._arrays_of(index).merge_logprobs(choice["logprobs"], value, _LOGPROB_LISTS)
            elif key == "token_ids" and type(value) is list:
                self._arrays_of(index).extend("token_ids", value)
            elif key in _WHOLE_CHOICE_KEYS or key == "finish_reason":
                if value is not None or key not in choice:
                    choice[key] = value
            else:
                merge_unknown(choice, key, value)


