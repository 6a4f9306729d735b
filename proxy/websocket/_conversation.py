"""What one socket remembers of its responses, so each ``response.create`` is recorded (and, bridged,
sent) as the whole request it stands for (docs/wire.md).

On a socket a client sends only the new input of each turn with the ``previous_response_id`` of the
last response: the server keeps the rest "in memory on the open socket". The sidecar keeps it too,
the way the server does: the previous response's whole input, then its output items, then the new
input. A chain to a response the socket never saw (made over HTTP, stored upstream) is left as it
came. ``instructions`` are never carried over (the Responses API does not carry them either).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional

#: Responses remembered per socket (a client chains to the last one; a fork to an earlier one).
_KEPT = 8


def as_items(value: Any) -> list[Any]:
    """A request's ``input`` as a list of items (a string is one user message, as the API reads it)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        return list(value)
    return []


class Conversation:
    """The socket's responses by id: the whole input each one answered, and its output."""

    def __init__(self) -> None:
        self._responses: OrderedDict[str, list[Any]] = OrderedDict()

    def whole_request(self, body: dict[str, Any]) -> tuple[dict[str, Any], Optional[str]]:
        """``body`` (a ``response.create``'s fields) with the remembered context in place of its
        ``previous_response_id``, and that id; the body unchanged (and None) when it chains to
        nothing the socket saw."""
        previous = body.get("previous_response_id")
        if not isinstance(previous, str) or previous not in self._responses:
            return body, None
        whole = {key: value for key, value in body.items() if key != "previous_response_id"}
        whole["input"] = [*self._responses[previous], *as_items(body.get("input"))]
        self._responses.move_to_end(previous)
        return whole, previous

    def remember(self, response_id: Any, whole_input: Any, response: Any) -> None:
        """A response ended: its id stands for its whole input and its output items from now on."""
        if not isinstance(response_id, str):
            return
        output = response.get("output") if isinstance(response, dict) else None
        self._responses[response_id] = [*as_items(whole_input), *(output if isinstance(output, list) else [])]
        self._responses.move_to_end(response_id)
        while len(self._responses) > _KEPT:
            self._responses.popitem(last=False)


__all__ = ["Conversation", "as_items"]
