"""Reassembly of an Anthropic Messages stream (docs/files.md).

Follows the anthropic SDK's ``accumulate_event``: the ``message_start`` envelope, content blocks
by index (text, thinking + signature, redacted_thinking, tool_use / server_tool_use whose
``partial_json`` is parsed at block stop, citations), ``message_delta`` stop reason and usage
(cumulative: the latest value wins, never summed), ``message_stop`` as the terminal and
``event: error`` as an error terminal. https://docs.anthropic.com/en/api/messages-streaming
"""

from __future__ import annotations

import copy
from typing import Any

import orjson

from ._reassembler import Reassembler, grow_list

_DELTA_TEXT_FIELDS = {"text_delta": "text", "thinking_delta": "thinking"}


class MessagesReassembler(Reassembler):
    dialect = "messages"

    def __init__(self) -> None:
        super().__init__()
        self._message: dict[str, Any] | None = None
        self._blocks: list[dict[str, Any] | None] = []
        self._partial_json: dict[int, list[str]] = {}
        self._error: Any = None
        #: Ended at the stop reason (`ends_when_whole`) and ``message_stop`` not yet seen: a later
        #: ``message_delta`` of the same read still counts (`_fold_after_whole`).
        self._after_whole = False
        self._stopped = False
        self._handlers = {
            "message_start": self._on_message_start,
            "content_block_start": self._on_content_block_start,
            "content_block_delta": self._on_content_block_delta,
            "content_block_stop": self._on_content_block_stop,
            "message_delta": self._on_message_delta,
            "message_stop": self._on_message_stop,
            "error": self._on_error,
        }

    def result(self) -> dict[str, Any] | None:
        if self._message is None and self._error is None:
            return None
        self.join_texts()
        message = dict(self._message or {"type": "message"})
        message["content"] = [block for block in self._blocks if block is not None]
        for index, pieces in self._partial_json.items():  # A cut stream: blocks never stopped.
            block = self._blocks[index] if index < len(self._blocks) else None
            if block is not None:
                block["input"] = _parse_input("".join(pieces))
        if self._error is not None:
            message["error"] = self._error
        return message

    def learn_template(self, prefix: bytes, data: bytes, payload: Any = None, event_type: str = "message") -> Any:
        """A ``content_block_delta`` of text, thinking or a tool's input JSON: its piece is the slot
        (`capture._event_templates`); a run's pieces go where `_on_content_block_delta` puts each."""
        return self._text_template(prefix, data, payload, event_type, self._template_slots)

    def _template_slots(self, event_type: str, payload: dict[str, Any]) -> Any:
        index, delta = payload.get("index"), payload.get("delta")
        if event_type != "content_block_delta" or type(index) is not int or type(delta) is not dict:
            return None
        block = self._blocks[index] if 0 <= index < len(self._blocks) else None
        kind = delta.get("type")
        field = _DELTA_TEXT_FIELDS.get(kind) if type(kind) is str else None
        if block is not None and field is not None and type(delta.get(field)) is str:
            return [("text", ("delta", field), "text")], lambda text: self.append_text(block, field, text)
        if kind == "input_json_delta" and index in self._partial_json and type(delta.get("partial_json")) is str:
            return [("text", ("delta", "partial_json"), "text")], self._partial_json[index].append
        return None

    def _on_payload(self, event_type: str, payload: dict[str, Any]) -> None:
        handler = self._handlers.get(event_type)
        if handler is not None:  # `ping` and unknown future events carry nothing to keep.
            handler(payload)

    def _on_message_start(self, payload: dict[str, Any]) -> None:
        if isinstance(payload.get("message"), dict):
            self._message = copy.deepcopy(payload["message"])
            content = self._message.get("content")
            self._blocks = [b if isinstance(b, dict) else None for b in content] if isinstance(content, list) else []

    def _on_content_block_start(self, payload: dict[str, Any]) -> None:
        block = payload.get("content_block")
        index: Any = payload.get("index")  # Checked by grow_list.
        if isinstance(block, dict) and grow_list(self._blocks, index):
            self._blocks[index] = copy.deepcopy(block)
            if "input" in block and block.get("type") != "mcp_tool_result":
                self._partial_json[index] = []

    def _on_content_block_delta(self, payload: dict[str, Any]) -> None:
        index, delta = payload.get("index"), payload.get("delta")
        blocks = self._blocks
        block = blocks[index] if type(index) is int and 0 <= index < len(blocks) else None
        if block is None or type(delta) is not dict:
            return
        kind = delta.get("type")
        field = _DELTA_TEXT_FIELDS.get(kind)  # type: ignore[arg-type]  # a missing type finds nothing
        if field is not None:
            piece = delta.get(field)
            if type(piece) is str:
                self.append_text(block, field, piece)
        elif kind == "input_json_delta" and payload["index"] in self._partial_json:
            self._partial_json[payload["index"]].append(str(delta.get("partial_json", "")))
        elif kind == "signature_delta":
            block["signature"] = delta.get("signature")
        elif kind == "citations_delta":
            citations = block.get("citations")
            block["citations"] = (citations if isinstance(citations, list) else []) + [delta.get("citation")]

    def _on_content_block_stop(self, payload: dict[str, Any]) -> None:
        index = payload.get("index")
        block = self._block_at(index)
        if block is not None and index in self._partial_json:
            block["input"] = _parse_input("".join(self._partial_json.pop(index)))

    def feed_data(self, event_type: str, data: bytes) -> None:
        if self.terminal and self._after_whole:
            self._fold_after_whole(event_type, data)
            return
        super().feed_data(event_type, data)

    def feed_event(self, event: Any) -> None:
        if self.terminal and self._after_whole:
            self._fold_after_whole(event.event, event.data.encode())
            return
        super().feed_event(event)

    def feed_payload(self, event_type: str, payload: dict[str, Any]) -> None:
        if self.terminal and self._after_whole:
            self._fold_after_whole(event_type, orjson.dumps(payload))
            return
        super().feed_payload(event_type, payload)

    def _fold_after_whole(self, event_type: str, data: bytes) -> None:
        """An event in the read that ended the reply at its stop reason, after it: a later
        ``message_delta`` (a gateway updating the usage) is folded as the SDK folds it, the latest
        counts winning, since the line is made from this read; ``message_stop`` closes. Events of
        later reads are not folded: the line is durable by then (docs/wire.md, "Durable before the
        agent's end")."""
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        kind = payload.get("type") if type(payload) is dict and event_type == "message" else event_type
        if kind == "message_delta" and type(payload) is dict:
            self._apply_delta(payload)
        elif kind in ("message_stop", "error"):
            self._after_whole = False

    def _on_message_delta(self, payload: dict[str, Any]) -> None:
        self._apply_delta(payload)
        self._ended_if_whole()
        if self.terminal and self.ends_when_whole and not self._stopped:
            self._after_whole = True  # Ended at the stop reason: what this read still holds is folded.

    def _apply_delta(self, payload: dict[str, Any]) -> None:
        if self._message is None:
            self._message = {"type": "message"}
        if isinstance(payload.get("delta"), dict):
            self._message.update(payload["delta"])
        usage = payload.get("usage")
        if isinstance(usage, dict):
            # Cumulative counts: the latest non-null value replaces the earlier one.
            earlier = self._message.get("usage")
            merged = dict(earlier) if isinstance(earlier, dict) else {}
            merged.update({key: value for key, value in usage.items() if value is not None})
            self._message["usage"] = merged

    def seen_whole(self) -> bool:
        """The ``message_delta`` with the stop reason has come: ``message_stop`` only follows."""
        message = self._message
        return self.terminal or (self._error is None and message is not None and message.get("stop_reason") is not None)

    def _on_message_stop(self, payload: dict[str, Any]) -> None:
        self.terminal = self._stopped = True

    def _on_error(self, payload: dict[str, Any]) -> None:
        self.terminal = True
        self.error_category = "upstream_error"
        self._error = payload.get("error", payload)

    def _block_at(self, index: Any) -> dict[str, Any] | None:
        if isinstance(index, int) and 0 <= index < len(self._blocks):
            return self._blocks[index]
        return None


def _parse_input(text: str) -> Any:
    """A tool's streamed input; an empty stream means ``{}``, unparseable text is kept raw."""
    if not text:
        return {}
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return {"_raw": text}
