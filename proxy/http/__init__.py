"""The wire (docs/layout.md, docs/wire.md): HTTP/1.1 over httptools, both ends. Imports nothing else of the project.

The server side's connection (`Http1Connection`: socket, parser, pipeline) and its `ReplyWriter`, the
upstream client and its pool (`UpstreamPool`, `UpstreamReply`), the one `Headers` type and its
rules (hop-by-hop stripping), and the body sinks a reply can be read into.
"""

from ._checks import certificate_problem, upstream_problem
from ._headers import Headers, client_response_headers, first_values, header_value, single_value, upstream_request_headers
from ._reply_writer import ReplyWriter
from ._server import KEEPALIVE_IDLE_SECONDS, Http1Connection, ServerRequest, say_refused_upgrade
from ._tunnel import ServerTunnel, StreamTunnel
from . import _websocket as websocket
from ._sinks import UpstreamBroke, WholeBody
from ._upstream import (
    BodySink,
    UpstreamConnectError,
    UpstreamPool,
    UpstreamProtocolError,
    UpstreamReply,
    UpstreamTimeout,
    UpgradeReply,
)

__all__ = [
    "BodySink",
    "Headers",
    "Http1Connection",
    "ReplyWriter",
    "KEEPALIVE_IDLE_SECONDS",
    "ServerRequest",
    "ServerTunnel",
    "StreamTunnel",
    "UpgradeReply",
    "UpstreamBroke",
    "UpstreamConnectError",
    "UpstreamPool",
    "UpstreamProtocolError",
    "UpstreamReply",
    "UpstreamTimeout",
    "WholeBody",
    "certificate_problem",
    "client_response_headers",
    "first_values",
    "header_value",
    "single_value",
    "say_refused_upgrade",
    "upstream_problem",
    "upstream_request_headers",
    "websocket",
]
