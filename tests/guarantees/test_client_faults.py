"""Promise 5 — client faults: a client that leaves mid-body or mid-stream, and slow readers."""

from __future__ import annotations

import pytest

import asyncio

import aiohttp

from tests.processes import SidecarProcess
from tests.scripted_upstream import sse_script
from tests.transcripts import chat_chunk

CHAT = "/v1/chat/completions"


async def test_client_leaving_mid_request_body_sends_nothing_upstream(upstream, sidecar, store, http):
    """Half a body, then the client hangs up: nothing goes upstream, nothing is recorded, the sidecar stays up."""
    host, port = sidecar.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /ng-rollout/half/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"{" * 100)
    await writer.drain()
    writer.close()
    await asyncio.sleep(0.3)
    assert upstream.received == [] and store.rollout_ids() == []
    assert (await http.get(sidecar.url + "/-/healthy")).status == 200


@pytest.mark.slow
async def test_slow_readers_push_back_on_the_upstream_and_memory_stays_bounded(upstream, tmp_path):
    """50 clients stop reading a 100 MB stream: the upstream is held back, the sidecar's RSS stays bounded.

    Loopback sockets buffer many MB each way in the kernel (tcp_rmem allows 32 MB here), so the
    upstream gets some way ahead and the sidecar's capture copy holds what it forwarded into
    those buffers; what matters is that both then stop: the upstream's sent count and the
    sidecar's RSS stay flat while the readers stall.
    """
    piece = chat_chunk([{"index": 0, "delta": {"content": "x" * 10_000}, "finish_reason": None}])
    offered = len(piece) * 10_000  # About 100 MB per stream, 5 GB for all 50.
    upstream.scripts[CHAT] = sse_script(b"", [piece] * 10_000)
    sidecar = SidecarProcess.start("--upstream", upstream.url, "--capture-dir", str(tmp_path))
    try:
        rss_before = sidecar.rss_bytes()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            responses = [await http.post(f"{sidecar.url}/ng-rollout/slow-{n}{CHAT}", data=b'{"stream": true}') for n in range(50)]
            for response in responses:
                await response.content.readexactly(64 * 1024)  # Then stall: read nothing more.
            await asyncio.sleep(4)
            sent_early, rss_early = upstream.bytes_sent.get(CHAT, 0), sidecar.rss_bytes()
            await asyncio.sleep(2)
            rss_stalled = sidecar.rss_bytes()
            sent = upstream.bytes_sent.get(CHAT, 0)
            for response in responses:
                response.close()
    finally:
        assert sidecar.terminate() == 0
    print(f"50 stalled readers: upstream sent {sent >> 20} of {(50 * offered) >> 20} MiB offered; sidecar RSS "
          f"{rss_before >> 20} -> {rss_early >> 20} -> {rss_stalled >> 20} MiB")
    assert sent < 0.5 * 50 * offered, f"backpressure reaches the upstream: it sent {sent} of {50 * offered} bytes"
    assert sent - sent_early < 0.01 * 50 * offered, f"the upstream kept sending: {sent - sent_early} bytes in 2 s"
    assert rss_stalled - rss_early < 16 * 1024 * 1024, f"RSS kept growing while stalled: {(rss_stalled - rss_early) >> 20} MiB"
    assert rss_stalled - rss_before < 0.25 * 50 * offered, f"RSS grew {(rss_stalled - rss_before) >> 20} MiB"
