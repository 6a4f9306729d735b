"""Promise 1 — acknowledged implies durable: SIGKILL the sidecar mid-load, nothing acknowledged is lost.

The sidecar runs as a real subprocess in front of the stand-in model server; 50 clients call it
(streaming and not) until it is killed once a seeded number of calls has been acknowledged (a
count, not a time: on a loaded machine a fixed delay can fall before the first answer). Each
call carries a unique `x-session-id`, which the line records as `client_session_id`.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import aiohttp
import orjson
import pytest

from tests import soak_or

from records import CaptureStore

from tests.processes import SidecarProcess

CLIENTS = 50
ROLLOUTS = 10


async def _client(http: aiohttp.ClientSession, url: str, number: int, acknowledged: set[str]) -> None:
    for call in range(10_000):
        call_id = f"c{number}-{call}"
        stream = (number + call) % 2 == 0
        body = {"model": "m", "messages": [{"role": "user", "content": f"call {call_id}"}], "stream": stream}
        target = f"{url}/ng-rollout/crash-{number % ROLLOUTS}/v1/chat/completions"
        try:
            async with http.post(target, data=orjson.dumps(body), headers={"x-session-id": call_id}) as response:
                received = b""
                async for chunk in response.content.iter_any():
                    received += chunk
                    if stream and b"data: [DONE]\n\n" in received:
                        acknowledged.add(call_id)  # The client has seen the terminal event.
                if not stream and response.status == 200 and len(received) == response.content_length:
                    acknowledged.add(call_id)  # The whole JSON body arrived.
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
            return


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(soak_or(6, 20)))  # `make soak` kills at 20 points.
async def test_sigkill_mid_load_loses_no_acknowledged_call(seed, stand_in, tmp_path):
    capture_dir = str(tmp_path)
    sidecar = SidecarProcess.start("--upstream", stand_in.url, "--capture-dir", capture_dir)
    acknowledged: set[str] = set()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        clients = [asyncio.create_task(_client(http, sidecar.url, n, acknowledged)) for n in range(CLIENTS)]
        kill_after = random.Random(seed).randint(5, 300)
        deadline = asyncio.get_running_loop().time() + 120
        while len(acknowledged) < kill_after and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        sidecar.kill()
        await asyncio.gather(*clients)
    store = CaptureStore(capture_dir)
    recorded = Counter()
    for rollout_id in store.rollout_ids():
        result = store.read_available(rollout_id)
        # Only the very last line of a file may be damaged (a write cut by the kill).
        assert result.malformed_indexes in ([], [len(result.lines)]), rollout_id
        recorded.update(line["client_session_id"] for line in result.lines)
    assert len(acknowledged) >= kill_after, (f"only {len(acknowledged)} of the {kill_after} calls to acknowledge before "
                                             "the kill were answered within 120 s")
    assert all(recorded[call_id] == 1 for call_id in acknowledged), "an acknowledged call has no line, or two"
    assert max(recorded.values()) == 1, "no call is recorded twice"
    print(f"seed {seed}: {len(acknowledged)} acknowledged calls, {sum(recorded.values())} lines intact after SIGKILL")

    restarted = SidecarProcess.start("--upstream", stand_in.url, "--capture-dir", capture_dir)
    try:
        async with aiohttp.ClientSession() as http:
            for rollout in range(ROLLOUTS):
                async with http.post(f"{restarted.url}/ng-rollout/crash-{rollout}/v1/chat/completions",
                                     data=b'{"model": "m", "messages": []}', headers={"x-session-id": "after"}) as response:
                    await response.read()
    finally:
        assert restarted.terminate() == 0
    for rollout_id in store.rollout_ids():
        lines = store.read_available(rollout_id).lines
        assert lines[-1]["client_session_id"] == "after", "a restarted sidecar appends to the same file"
