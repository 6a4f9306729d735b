"""The stand-in model server and the demo that drives it (not the sidecar; it depends on `proxy.app`).

`mcc demo` and `mcc serve --stand-in` put this server behind the sidecar so the product can be
tried with the real SDK clients on any machine, without a GPU: `server` (the aiohttp app),
`replies` (deterministic replies in the three dialects, whole and streamed, with vLLM's RL
fields on request), `demo` (the SDK-driven tour that prints what was captured), `_serving` (the
app on a socket).
"""

from ._serving import AppServer, serve_stand_in_forever, start_app, start_stand_in
from .demo import run_demo
from .server import STAND_IN_CREATED, create_stand_in_app

__all__ = ["AppServer", "STAND_IN_CREATED", "create_stand_in_app", "run_demo", "serve_stand_in_forever",
           "start_app", "start_stand_in"]
