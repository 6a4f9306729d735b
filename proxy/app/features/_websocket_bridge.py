"""The Responses WebSocket mode (docs/wire.md): a socket's responses as call lines, relayed or bridged
(`proxy.websocket`). The wire hands over only WebSocket upgrades."""

from __future__ import annotations

from typing import TYPE_CHECKING, Awaitable, Optional

from ...websocket import WebSocketMetrics, serve_websocket
from ._declaration import Feature, SettingsBase

if TYPE_CHECKING:
    from ...http import ReplyWriter, ServerRequest


class WebSocketFeature(Feature):
    """Takes every upgraded connection."""

    name = "websocket"
    metrics = (WebSocketMetrics,)

    @classmethod
    def wanted(cls, settings: SettingsBase) -> bool:
        return True

    def serve_upgrade(self, request: "ServerRequest", client: "ReplyWriter") -> Optional[Awaitable[None]]:
        return serve_websocket(self.host.calls, request, client)
