"""Promise 4 — upstream faults: a clear local error or exactly the bytes sent before the failure,
the right category on the line, and the sidecar keeps serving other calls meanwhile."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.scripted_upstream import Script, json_script, sse_script
from tests.transcripts import CHAT_JSON, CHAT_JSON_REQUEST, CHAT_REQUEST, CHAT_STREAM
from tests.wire import rollout_url

CHAT = "/v1/chat/completions"
HEALTHY = "/v1/responses"
HALF = CHAT_STREAM[:150]

FAULTS = {
    # name: (script, expected status, expected category, bytes the client must get, client sees an error)
    "accepts then never answers": (Script(delay_head=30), 504, "timeout", None, False),
    "resets before headers": (Script(garbage=b""), 502, "connection", None, False),
    "resets mid-stream": (sse_script(HALF, [HALF[:70], HALF[70:]], ending="reset"), 200, "stream_truncated", HALF, True),
    "answers garbage": (Script(garbage=b"SSH-2.0-OpenSSH_9.6\r\n"), 502, "connection", None, False),
    "trickles one byte a second": (sse_script(b"data: [DONE]\n\n", [b"d", b"a", b"ta: [DONE]\n\n"], pause=1.0),
                                   200, None, b"data: [DONE]\n\n", False),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(FAULTS))
async def test_upstream_fault(fault, http, upstream, start, capture_dir, store):
    script, status, category, expected_bytes, client_error = FAULTS[fault]
    upstream.scripts[CHAT] = script
    upstream.scripts[HEALTHY] = json_script(CHAT_JSON)
    sidecar = await start(upstream.url, capture_dir=capture_dir, read_timeout=2.0)

    async def faulty() -> tuple[int, bytes, bool]:
        async with http.post(rollout_url(sidecar.url, "fault", CHAT), data=CHAT_REQUEST) as response:
            received, failed = b"", False
            try:
                async for chunk in response.content.iter_any():
                    received += chunk
            except aiohttp.ClientError:
                failed = True
            return response.status, received, failed

    async def healthy_calls() -> list[int]:
        statuses = []
        for _ in range(5):
            await asyncio.sleep(0.1)
            async with http.post(rollout_url(sidecar.url, "healthy", HEALTHY), data=CHAT_JSON_REQUEST) as response:
                await response.read()
                statuses.append(response.status)
        return statuses

    (got_status, received, failed), others = await asyncio.gather(faulty(), healthy_calls())
    assert others == [200] * 5, "the sidecar keeps serving other calls"
    assert got_status == status
    if expected_bytes is not None:
        assert received == expected_bytes and failed is client_error
    (line,) = store.read("fault")
    assert line["error_category"] == category
    assert (await http.get(sidecar.url + "/-/healthy")).status == 200
