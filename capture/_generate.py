"""Reassembly of vLLM's token-in/token-out stream, ``POST /inference/v1/generate`` (docs/wire.md).

What frameworks that render prompts themselves call (verl's agent gateway, SkyRL's proxy): the
request carries the prompt's ``token_ids`` and ``sampling_params``; the reply names no ``object``.
A stream is chunks with ``request_id``, ``choices`` (one per ``index``), ending with
``data: [DONE]`` (vLLM's ``entrypoints/scale_out/token_in_token_out/serving.py``). Per choice:
``token_ids`` concatenated, ``logprobs.content`` (entries with an integer ``token_id``)
concatenated, ``text`` appended when ``output_mode`` is ``text``, ``finish_reason`` the last
non-null, ``weight_versions`` (on the final chunk) kept. ``prompt_token_ids`` (the first chunk,
with ``return_token_ids``), ``usage`` (the last chunk, with ``include_usage``) and ``metrics``:
the last non-null wins. The rebuilt reply has the shape of the JSON reply (``GenerateResponse``).
"""

from __future__ import annotations

from typing import Any

from ._chat import merge_unknown
from ._completions import CompletionsReassembler
from ._reassembler import grow_list

#: A generate reply's top-level keys handled here, not by `merge_unknown`.
_ENVELOPE_KEYS = ("request_id", "model", "created", "output_mode")


class GenerateReassembler(CompletionsReassembler):
    """`CompletionsReassembler`'s envelope, usage, extras and error rules; its own choices."""

    done_is_terminal = True
    dialect = "generate"
    reply_object = None
    envelope_keys = _ENVELOPE_KEYS
    known_chunk_keys = frozenset({*_ENVELOPE_KEYS, "choices", "usage", "error"})

    def _on_choice(self, chunk_choice: dict[str, Any]) -> None:
        index = chunk_choice.get("index", 0)
        choices = self._choices
        if not grow_list(choices, index):
            return
        choice = choices[index]
        if choice is None:
            choice = choices[index] = {"index": index, "finish_reason": None}
        for key, value in chunk_choice.items():
            if key == "index":
                continue
            if key == "text":
                if type(value) is str and value:
                    self.append_text(choice, "text", value)
                else:
                    choice.setdefault("text", "")
            elif key == "logprobs":
                if type(value) is dict:
                    choice["logprobs"] = self._arrays_of(index).merge_logprobs(choice.get("logprobs"), value, ("content",))
                elif "logprobs" not in choice:
                    choice["logprobs"] = value
            elif key == "token_ids" and type(value) is list:
                self._arrays_of(index).extend("token_ids", value)
            elif key == "finish_reason":
                if value is not None:
                    choice[key] = value
            else:
                merge_unknown(choice, key, value)
