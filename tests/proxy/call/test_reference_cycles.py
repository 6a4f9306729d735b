"""A call leaves no reference cycle behind (issue 34): whatever a call allocated is freed when it
ends, not by the garbage collector, whose passes over the objects of every call in flight cost a
capturing sidecar ~15% of its CPU when each call left a cycle."""

from __future__ import annotations

import gc
from collections import Counter

import orjson

from tests.wire import fetch, rollout_url

#: The per-call objects of the sidecar's own code; any of them in a cycle is a regression.
_PER_CALL = {"Call", "TokenHooks", "WeightVersionHooks", "CallExchange", "BodyPump", "AddedFieldCutter", "StreamTap", "BodyTap",
             "ServerRequest", "UpstreamReply", "ChatReassembler", "SSEParser", "TokenPlan"}


async def test_calls_in_every_mode_leave_no_cycle_to_the_collector(http, stand_in, start, capture_dir):
    """JSON and streamed calls, captured and in the token capture mode (a cutter, the training-token
    files), and a plain forwarded one: none of their objects is left in a cycle."""
    plain = await start(stand_in.url)
    captured = await start(stand_in.url, capture_dir=capture_dir)
    tokens = await start(stand_in.url, capture_dir=capture_dir + "-tokens", capture_tokens=True)
    chat = {"model": "m", "messages": [{"role": "user", "content": "cycles"}]}
    bodies = [orjson.dumps(chat), orjson.dumps({**chat, "stream": True})]
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for sidecar in (plain, captured, tokens):
            for n, body in enumerate(bodies * 2):
                reply = await fetch(http, "POST", rollout_url(sidecar.url, f"r{n}", "/v1/chat/completions"), body)
                assert reply.status == 200
        gc.collect()
        left = Counter(type(thing).__name__ for thing in gc.garbage if type(thing).__name__ in _PER_CALL)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not left, f"objects of finished calls left in reference cycles: {dict(left)}"
