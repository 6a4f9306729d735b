"""The Responses WebSocket mode (docs/wire.md): a socket's responses captured as call lines.

`serve_websocket` answers an ``Upgrade: websocket`` on a prefixed ``/v1/responses``: relayed
unchanged to an upstream that accepts it (`_relay`), else served here and bridged to streamed
``POST /v1/responses`` calls (`_bridge`). Below it the wire (`proxy.http`: framing, tunnels) and
the call (`proxy.call`: each bridged response is an ordinary call, with its hooks).
"""

from ._metrics import WebSocketMetrics
from ._upgrade import serve_websocket

__all__ = ["WebSocketMetrics", "serve_websocket"]
