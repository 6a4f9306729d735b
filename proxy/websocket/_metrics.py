"""The WebSocket mode's metrics (docs/operations.md), on the sidecar's registry (`SidecarMetrics.feature`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class WebSocketMetrics:
    """How Responses WebSockets were served, and those whose capture stopped."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.websockets = Counter("mcc_websockets_total", "Responses WebSocket connections served, by how: relay "
                                  "(the upstream took the upgrade) or bridge (streamed POSTs).", ["mode"],
                                  registry=registry)
        self.websocket_capture_stopped = Counter("mcc_websocket_capture_stopped_total", "Relayed WebSockets whose "
                                                 "frames could not be read: relayed on, their capture stopped.",
                                                 registry=registry)
