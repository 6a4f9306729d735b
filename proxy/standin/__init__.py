"""The stand-in model server and the demo that drives it (not the sidecar).

`mcc demo` and `mcc serve --stand-in` put this server behind the sidecar so the product can be
tried with the real SDK clients on any machine, without a GPU: `server` (the aiohttp app),
`replies` (deterministic replies in the three dialects, whole and streamed, with vLLM's RL
fields on request), `demo` (the SDK-driven tour that prints what was captured).
"""

from .demo import run_demo
from .server import STAND_IN_CREATED, create_stand_in_app

__all__ = ["STAND_IN_CREATED", "create_stand_in_app", "run_demo"]
