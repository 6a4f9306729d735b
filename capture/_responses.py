"""Reassembly of an OpenAI Responses API stream (docs/files.md).

Event reference: https://platform.openai.com/docs/api-reference/responses-streaming. The terminal
event (`response.completed` / `response.incomplete` / `response.failed`) carries the whole
response, which is the result; a cut stream yields the last response snapshot with the output
items rebuilt from `output_item.*`, content parts and the text / argument / reasoning deltas.

``output_text`` logprobs (asked for with ``include: ["message.output_text.logprobs"]``) arrive on
each text delta; a server whose terminal response leaves a part's ``logprobs`` empty or out gets
them filled from the deltas (or the ``done`` event), so what the stream carried is kept.
"""

from __future__ import annotations

import copy
from typing import Any

from ._reassembler import Reassembler, grow_list

_TERMINAL_EVENTS = {
    "response.completed": None,
    "response.incomplete": "incomplete",
    "response.failed": "upstream_error",
}
#: A terminal response's ``status`` that makes the call an error, whatever the event's name.
_STATUS_CATEGORIES = {"incomplete": "incomplete", "failed": "upstream_error"}


def status_category(response: dict[str, Any]) -> "str | None":
    """The category a Responses body's ``status`` says (vLLM 0.32 ends a capped stream with
    ``response.completed`` whose status is "incomplete"); None for any other status."""
    status = response.get("status")
    return _STATUS_CATEGORIES.get(status) if isinstance(status, str) else None
_SNAPSHOT_EVENTS = ("response.created", "response.in_progress", "response.queued")

# delta / done event -> (container key inside the item, field in the part, is the part the item)
_TEXT_FIELDS = {
    "response.output_text": ("content", "content_index", "text"),
    "response.refusal": ("content", "content_index", "refusal"),
    "response.reasoning_text": ("content", "content_index", "text"),
    "response.reasoning_summary_text": ("summary", "summary_index", "text"),
}
_ITEM_FIELDS = {
    "response.function_call_arguments": "arguments",
    "response.custom_tool_call_input": "input",
    "response.code_interpreter_call_code": "code",
}


class ResponsesReassembler(Reassembler):
    dialect = "responses"

    def __init__(self) -> None:
        super().__init__()
        self._snapshot: dict[str, Any] | None = None
        self._final: dict[str, Any] | None = None
        self._items: list[dict[str, Any] | None] = []
        #: (output_index, content_index) -> that output_text part's logprobs, extended in place.
        self._text_logprobs: dict[tuple[int, int], list[Any]] = {}

    def result(self) -> dict[str, Any] | None:
        if self._final is not None:
            return self._final
        if self._snapshot is None and not self._items:
            return None
        self.join_texts()
        partial = dict(self._snapshot or {"object": "response"})
        partial["output"] = [item for item in self._items if item is not None]
        return partial

    def learn_template(self, prefix: bytes, data: bytes, payload: Any = None, event_type: str = "message") -> Any:
        """A text, reasoning, refusal or arguments ``*.delta`` event without logprobs: its delta is
        the slot, its ``sequence_number`` is only checked (`capture._event_templates`); a run's
        deltas go where `_on_delta_or_done` puts each."""
        return self._text_template(prefix, data, payload, event_type, self._template_slots)

    def _template_slots(self, event_type: str, payload: dict[str, Any]) -> Any:
        stem, _, phase = event_type.rpartition(".")
        if phase != "delta" or type(payload.get("delta")) is not str or payload.get("logprobs"):
            return None
        if event_type in _TERMINAL_EVENTS or event_type in _SNAPSHOT_EVENTS or stem.startswith(
                ("response.output_item", "response.content_part", "response.reasoning_summary_part")):
            return None
        item = self._item_at(payload)
        if item is None:
            return None
        if stem in _ITEM_FIELDS:
            target, field = item, _ITEM_FIELDS[stem]
        elif stem in _TEXT_FIELDS:
            key, index_key, field = _TEXT_FIELDS[stem]
            parts, index = item.get(key), payload.get(index_key)
            if type(parts) is not list or type(index) is not int or not 0 <= index < len(parts) or type(parts[index]) is not dict:
                return None
            target = parts[index]
        else:
            return None
        if type(target.get(field)) is not str:
            return None  # The first delta makes it one (`_apply_text`); runs come after.
        slots = [("text", ("delta",), "text")]
        if type(payload.get("sequence_number")) is int:
            slots.append(("sequence_number", ("sequence_number",), "number"))
        return slots, lambda text: self.append_text(target, field, text)

    def _on_payload(self, event_type: str, payload: dict[str, Any]) -> None:
        if event_type in _TERMINAL_EVENTS:
            self._on_terminal(event_type, payload)
        elif event_type in _SNAPSHOT_EVENTS:
            if isinstance(payload.get("response"), dict):
                self._snapshot = payload["response"]
        elif event_type == "error":
            self.error_category = "upstream_error"
        elif event_type.startswith("response.output_item."):
            self._on_item(payload)
        elif event_type.startswith(("response.content_part.", "response.reasoning_summary_part.")):
            self._on_part(event_type, payload)
        else:
            self._on_delta_or_done(event_type, payload)

    def _on_terminal(self, event_type: str, payload: dict[str, Any]) -> None:
        self.terminal = True
        response = payload.get("response")
        if self.error_category is None:
            self.error_category = _TERMINAL_EVENTS[event_type]
            if self.error_category is None and isinstance(response, dict):
                # vLLM 0.32 ends a capped stream with `response.completed` whose status is
                # "incomplete" (OpenAI sends `response.incomplete`): the status decides (docs/files.md).
                self.error_category = status_category(response)
        if isinstance(response, dict):
            self._final = response
            if self._text_logprobs:
                self._fill_missing_logprobs(response)

    def _fill_missing_logprobs(self, response: dict[str, Any]) -> None:
        output = response.get("output")
        if type(output) is not list:
            return
        for (item_index, part_index), logprobs in self._text_logprobs.items():
            if not logprobs or item_index >= len(output) or type(output[item_index]) is not dict:
                continue
            parts = output[item_index].get("content")
            if type(parts) is list and part_index < len(parts) and type(parts[part_index]) is dict:
                if not parts[part_index].get("logprobs"):
                    parts[part_index]["logprobs"] = logprobs

    def _on_item(self, payload: dict[str, Any]) -> None:
        item = payload.get("item")
        index: Any = payload.get("output_index")  # Checked by grow_list.
        if isinstance(item, dict) and grow_list(self._items, index):
            self._items[index] = copy.deepcopy(item)

    def _on_part(self, event_type: str, payload: dict[str, Any]) -> None:
        is_summary = event_type.startswith("response.reasoning_summary_part.")
        key, index_key = ("summary", "summary_index") if is_summary else ("content", "content_index")
        item, part = self._item_at(payload), payload.get("part")
        if item is None or not isinstance(part, dict):
            return
        parts = item.setdefault(key, [])
        if isinstance(parts, list) and grow_list(parts, payload.get(index_key)):
            parts[payload[index_key]] = part = dict(part)
            kept = None if is_summary else self._text_logprobs.get((payload["output_index"], payload[index_key]))
            if kept and not part.get("logprobs"):
                part["logprobs"] = kept

    def _on_delta_or_done(self, event_type: str, payload: dict[str, Any]) -> None:
        stem, _, phase = event_type.rpartition(".")
        if phase not in ("delta", "done"):
            return
        item = self._item_at(payload)
        if item is None:
            return
        if stem in _ITEM_FIELDS:
            done_key = _ITEM_FIELDS[stem]
            self._apply_text(item, done_key, payload, phase, done_key)
        elif stem in _TEXT_FIELDS:
            key, index_key, field = _TEXT_FIELDS[stem]
            part = _part_at(item, key, payload.get(index_key), stem)
            if part is not None:
                self._apply_text(part, field, payload, phase, field)
                if stem == "response.output_text" and type(payload.get("logprobs")) is list and payload["logprobs"]:
                    self._keep_logprobs(part, payload, phase)

    def _keep_logprobs(self, part: dict[str, Any], payload: dict[str, Any], phase: str) -> None:
        """A delta's logprobs appended in place (linear in the stream); a done event's are the whole list."""
        key = (payload["output_index"], payload["content_index"])
        kept = self._text_logprobs.get(key)
        if phase == "done" or kept is None:
            kept = self._text_logprobs[key] = payload["logprobs"]
        else:
            kept.extend(payload["logprobs"])
        part["logprobs"] = kept

    def _apply_text(self, target: dict[str, Any], field: str, payload: dict[str, Any], phase: str, done_key: str) -> None:
        if phase == "delta":
            delta = payload.get("delta")
            if isinstance(delta, str):
                if not isinstance(target.get(field), str):
                    target[field] = ""
                self.append_text(target, field, delta)
        else:
            value = payload.get(done_key)
            if isinstance(value, str):
                self.set_text(target, field, value)

    def _item_at(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        index = payload.get("output_index")
        if isinstance(index, int) and 0 <= index < len(self._items):
            return self._items[index]
        return None


def _part_at(item: dict[str, Any], key: str, index: Any, stem: str) -> dict[str, Any] | None:
    """The content / summary part at ``index``, created when a delta arrives before its part."""
    parts = item.setdefault(key, [])
    if not isinstance(parts, list) or not grow_list(parts, index):
        return None
    if parts[index] is None:
        part_type = {
            "response.output_text": "output_text",
            "response.refusal": "refusal",
            "response.reasoning_text": "reasoning_text",
            "response.reasoning_summary_text": "summary_text",
        }[stem]
        parts[index] = {"type": part_type}
    return parts[index]


