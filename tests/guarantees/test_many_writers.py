"""Promise 2 — many writers, one file: 4 sidecar processes share a capture dir and rollout ids."""

from __future__ import annotations

import pytest

import asyncio

import aiohttp
import orjson

from records import CaptureStore

from tests.processes import SidecarProcess

SIDECARS = 4
CALLS_EACH = 500
ROLLOUTS = 5
LONG_PROMPT = "x" * 70_000  # Lines above 64 KiB, bigger than a pipe buffer, must still not interleave.


@pytest.mark.slow
async def test_four_sidecars_500_calls_each_give_2000_intact_lines(stand_in, tmp_path):
    sidecars = [SidecarProcess.start("--upstream", stand_in.url, "--capture-dir", str(tmp_path)) for _ in range(SIDECARS)]
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
            async def call(number: int) -> int:
                sidecar = sidecars[number % SIDECARS]
                prompt = LONG_PROMPT if number % 25 == 0 else f"call {number}"
                body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": prompt}], "stream": number % 2 == 0})
                async with http.post(f"{sidecar.url}/ng-rollout/shared-{number % ROLLOUTS}/v1/chat/completions", data=body) as reply:
                    await reply.read()
                    return reply.status

            statuses = await asyncio.gather(*(call(n) for n in range(SIDECARS * CALLS_EACH)))
        assert statuses == [200] * (SIDECARS * CALLS_EACH)
    finally:
        for sidecar in sidecars:
            assert sidecar.terminate() == 0
    store = CaptureStore(str(tmp_path))
    ids, long_lines = set(), 0
    for rollout_id in store.rollout_ids():
        result = store.read_available(rollout_id)
        assert result.malformed == 0 and not result.torn_last_line
        assert result.call_indexes == list(range(len(result.lines))), "call_index is dense"
        ids.update(line["model_call_id"] for line in result.lines)
        long_lines += sum(1 for line in result.lines if len(orjson.dumps(line)) > 64 * 1024)
    assert len(ids) == SIDECARS * CALLS_EACH
    assert long_lines == SIDECARS * CALLS_EACH // 25
