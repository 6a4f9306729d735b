"""Promise 9 — soak (`make soak`, not part of `make test`): 1,000 concurrent streams for minutes,
random client aborts; RSS and open file descriptors stay flat; no record lost or duplicated.

MCC_SOAK_SECONDS sets the load duration (default 180; the whole run stays under 10 minutes).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter

import aiohttp
import pytest

from records import CaptureStore
from tests.processes import SidecarProcess
from tests.scripted_upstream import ScriptedUpstream, split_every, sse_script
from tests.transcripts import CHAT_REQUEST, CHAT_STREAM

pytestmark = pytest.mark.soak
STREAMS = 1_000
CHAT = "/v1/chat/completions"


async def test_soak(tmp_path):
    seconds = float(os.environ.get("MCC_SOAK_SECONDS", "180"))
    upstream = await ScriptedUpstream().start()
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM, split_every(CHAT_STREAM, 60), pause=0.05)
    sidecar = SidecarProcess.start("--upstream", upstream.url, "--capture-dir", str(tmp_path), "--log-level", "warning")
    rng = random.Random(1)
    calls, aborted, completed = [], [0], [0]
    samples = []

    async def worker(http: aiohttp.ClientSession, number: int, deadline: float) -> None:
        serial = 0
        while time.monotonic() < deadline:
            call_id = f"w{number}-{serial}"
            serial += 1
            calls.append(call_id)
            async with http.post(f"{sidecar.url}/ng-rollout/soak-{number % 50}{CHAT}", data=CHAT_REQUEST,
                                 headers={"x-session-id": call_id}) as response:
                if rng.random() < 0.1:
                    await response.content.readany()
                    response.close()  # A client that gives up mid-stream.
                    aborted[0] += 1
                else:
                    assert await response.read() == CHAT_STREAM
                    completed[0] += 1

    started = time.monotonic()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=120)) as http:
            workers = [asyncio.create_task(worker(http, n, started + seconds)) for n in range(STREAMS)]
            await asyncio.sleep(min(20, seconds / 4))  # Warm up before the first sample.
            while not all(w.done() for w in workers):
                samples.append((time.monotonic() - started, sidecar.rss_bytes(), sidecar.open_fds()))
                await asyncio.wait(workers, timeout=10)
            for w in workers:
                w.result()
        await asyncio.sleep(2)  # Lines of the last aborted calls are written in the background.
        samples.append((time.monotonic() - started, sidecar.rss_bytes(), sidecar.open_fds()))
    finally:
        assert sidecar.terminate() == 0
        await upstream.close()

    store = CaptureStore(str(tmp_path))
    recorded, malformed = Counter(), 0
    for rollout_id in store.rollout_ids():
        result = store.read_available(rollout_id)
        malformed += result.malformed
        recorded.update(line["client_session_id"] for line in result.lines)
    lost = [call_id for call_id in calls if recorded[call_id] == 0]
    duplicated = [call_id for call_id, count in recorded.items() if count > 1]
    (_, rss_start, fds_start), (_, rss_end, fds_end) = samples[0], samples[-1]
    print(f"\n| calls | completed | aborted | records | lost | duplicated | malformed | RSS start | RSS end "
          f"| fds start | fds end |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
          f"| {len(calls)} | {completed[0]} | {aborted[0]} | {sum(recorded.values())} | {len(lost)} | {len(duplicated)} "
          f"| {malformed} | {rss_start >> 20} MiB | {rss_end >> 20} MiB | {fds_start} | {fds_end} |")
    assert not lost and not duplicated and malformed == 0
    assert rss_end - rss_start < 64 * 1024 * 1024, "RSS stays flat"
    assert fds_end <= fds_start + 16, "no file descriptor leaks"
