"""Declared weight versions in a call (issue 32): `WeightVersionHooks`, once a version is declared.

Upstream request: the call starts watching the declared version (`DeclaredWeightVersions.watch`);
terminal: it stops (tokens after this are no call's); line: the spans of each choice, unless the
engine named its own weights in the reply (`proxy.call.build_line` puts those first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ..call import CallHooks
from ._declared_versions import DeclaredWeightVersions, WeightWatch

if TYPE_CHECKING:
    from ..call import CallExchange, CallView
    from ..http import Headers


class WeightVersionHooks(CallHooks):
    """One call's view of the trainer's declared versions."""

    __slots__ = ("board", "watch")

    def __init__(self, board: DeclaredWeightVersions) -> None:
        self.board = board
        self.watch: Optional[WeightWatch] = None

    def upstream_request(self, call: "CallView", headers: "Headers") -> "Headers":
        if self.watch is None and call.exchange is not None:
            self.watch = self.board.watch(call.exchange)
        return headers

    def terminal(self, call: "CallView") -> None:
        if self.watch is not None:
            self.watch.stop()

    def line_fields(self, exchange: "CallExchange", fields: dict[str, Any]) -> None:
        """The line's declared weight versions, per choice, as this call saw them."""
        watch = self.watch
        if watch is None or exchange.status_code is None or "weight_versions" in fields:
            return  # Never watched, never sent, or the engine named its own.
        response = fields.get("response")
        choices = response.get("choices") if isinstance(response, dict) else None
        indexes = [choice.get("index", position) if isinstance(choice, dict) else position
                   for position, choice in enumerate(choices)] if isinstance(choices, list) and choices else [0]
        fields.update(watch.line_fields(indexes))
