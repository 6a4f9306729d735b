"""Promise 7 — no secret on disk; promise 10 — graceful shutdown on SIGTERM."""

from __future__ import annotations

import pytest

import asyncio
import os
import signal

import aiohttp

from proxy.app import free_port

from tests.capture_dirs import rollout_files
from tests.conftest import SECRET_MARKER
from tests.processes import SidecarProcess
from tests.scripted_upstream import json_script, split_every, sse_script
from tests.transcripts import CHAT_JSON, CHAT_JSON_REQUEST, CHAT_REQUEST, CHAT_STREAM

CHAT = "/v1/chat/completions"
SECRET_HEADERS = {
    "Authorization": f"Bearer {SECRET_MARKER}-1",
    "x-api-key": f"{SECRET_MARKER}-2",
    "api-key": f"{SECRET_MARKER}-3",
    "Cookie": f"session={SECRET_MARKER}-4",
    "Proxy-Authorization": f"Basic {SECRET_MARKER}-5",
}
SECRET_QUERY = f"?api_key={SECRET_MARKER}-6&key={SECRET_MARKER}-7"


async def test_no_credential_reaches_the_disk(http, upstream, start, capture_dir):
    """Credentials in headers and query parameters, on every kind of call: none is ever written."""
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM)
    upstream.scripts["/v1/messages"] = json_script(CHAT_JSON)
    sidecar = await start(upstream.url, capture_dir=capture_dir, max_body_bytes=10_000)
    refused = await start(f"http://127.0.0.1:{free_port()}", capture_dir=capture_dir)
    calls = [(sidecar, CHAT, CHAT_REQUEST), (sidecar, "/v1/messages", CHAT_JSON_REQUEST),
             (sidecar, CHAT, b"x" * 20_000), (refused, CHAT, CHAT_JSON_REQUEST)]
    for server, path, body in calls:
        async with http.post(f"{server.url}/ng-rollout/secret{path}{SECRET_QUERY}", data=body, headers=SECRET_HEADERS) as reply:
            await reply.read()
    written = b"".join(open(os.path.join(capture_dir, name), "rb").read() for name in rollout_files(capture_dir))
    assert written.count(b"\n") == 4, "every call was captured"
    assert SECRET_MARKER.encode() not in written
    assert upstream.received[0].header("Authorization") == SECRET_HEADERS["Authorization"], "still forwarded"


@pytest.mark.slow
async def test_sigterm_drains_in_flight_streams_then_exits_zero(upstream, tmp_path):
    """SIGTERM: new connections are refused, in-flight streams finish, their lines are on disk, exit 0."""
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM, split_every(CHAT_STREAM, 200), pause=0.3)
    sidecar = SidecarProcess.start("--upstream", upstream.url, "--capture-dir", str(tmp_path), "--drain-timeout", "20")

    async def stream(http: aiohttp.ClientSession, number: int) -> bytes:
        async with http.post(f"{sidecar.url}/ng-rollout/drain-{number}{CHAT}", data=CHAT_REQUEST) as response:
            return await response.read()

    async with aiohttp.ClientSession() as http:
        streams = [asyncio.create_task(stream(http, n)) for n in range(5)]
        await asyncio.sleep(0.4)
        sidecar.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        host, port = sidecar.url.removeprefix("http://").split(":")
        try:
            _, writer = await asyncio.open_connection(host, int(port))
            writer.close()
            accepted = True
        except ConnectionError:
            accepted = False
        bodies = await asyncio.gather(*streams)
    assert not accepted, "no new connection is accepted once draining"
    assert bodies == [CHAT_STREAM] * 5, "in-flight streams finish with every byte"
    assert await asyncio.to_thread(sidecar.process.wait, 30) == 0
    for number in range(5):
        assert (tmp_path / f"drain-{number}.capture.jsonl").read_bytes().count(b"\n") == 1


@pytest.mark.slow
def test_a_rolling_update_keeps_serving_through_the_shutdown_delay(tmp_path):
    """Issue 21, point 5: after SIGTERM, --shutdown-delay keeps the listener open (calls routed during
    endpoint propagation are served and captured) while /-/ready says 503; then the drain, and a
    last line that says how it ended."""
    import signal as signals
    import time
    import urllib.error
    import urllib.request

    sidecar = SidecarProcess.start("--stand-in", "--shutdown-delay", "3", "--capture-dir", str(tmp_path))
    sidecar.process.send_signal(signals.SIGTERM)
    time.sleep(0.5)
    try:
        urllib.request.urlopen(sidecar.url + "/-/ready", timeout=10)
        raise AssertionError("/-/ready must say 503 while shutting down")
    except urllib.error.HTTPError as error:
        assert error.code == 503 and b'"shutting down"' in error.read()
    request = urllib.request.Request(sidecar.url + "/ng-rollout/late/v1/chat/completions", method="POST",
                                     data=b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200, "a call routed during the delay is served"
    assert sidecar.process.wait(timeout=60) == 0
    time.sleep(0.2)
    assert any("drained: 0 calls finished, 0 cut; exit 0" in line for line in sidecar.stderr_lines), sidecar.stderr_lines
    assert (tmp_path / "late.capture.jsonl").stat().st_size > 0
