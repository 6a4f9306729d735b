"""Promise 6 — bad input: a clear error or faithful pass-through, nothing written outside the
capture dir, no host but the configured upstream reached, and the sidecar stays up.

Every case is sent as raw bytes over a socket, so requests no HTTP client would build (smuggling
attempts, absolute-form targets, oversized headers) reach the sidecar exactly as written.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.capture_dirs import rollout_files
from tests.scripted_upstream import json_script, sse_script

CHAT = "/v1/chat/completions"
OK_BODY = b'{"model": "m", "messages": []}'


def post(target: str, body: bytes = OK_BODY, extra: str = "") -> bytes:
    return (f"POST {target} HTTP/1.1\r\nHost: sidecar\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n").encode() + body


BAD_ROLLOUT_IDS = ["..", "%2e%2e", "%2E%2e", ".", "%2e", "..%2F..%2Fetc", "a%2F..%2Fb", "%2F", "a%5Cb", "a%00b", "%00",
                   "caf%C3%A9", "%E2%98%83", "%ff%fe", "a" * 201, "-a", "_a", ".hidden", "a%20b", "a+b", "a:b",
                   "a*b", "%25", "a%0Ab", "a%0D%0Ab", "a%09b", "%C0%AE%C0%AE"]

CASES: dict[str, tuple[bytes, str]] = {}
for rollout_id in BAD_ROLLOUT_IDS:
    CASES[f"rollout id {rollout_id[:20]!r}"] = (post(f"/ng-rollout/{rollout_id}{CHAT}"), "local 400")
CASES.update({
    "rollout id empty": (post(f"/ng-rollout/{CHAT}"), "local 400"),
    "malformed JSON body": (post(f"/ng-rollout/b1{CHAT}", b'{"model": '), "forwarded"),
    "non-object JSON body": (post(f"/ng-rollout/b1{CHAT}", b"[1, 2, 3]"), "forwarded"),
    "JSON string body": (post(f"/ng-rollout/b1{CHAT}", b'"hello"'), "forwarded"),
    "invalid UTF-8 body": (post(f"/ng-rollout/b1{CHAT}", b'{"a": "\xff\xfe"}'), "forwarded"),
    "empty body": (post(f"/ng-rollout/b1{CHAT}", b""), "forwarded"),
    "number out of range": (post(f"/ng-rollout/b1{CHAT}", b'{"n": 1e999999}'), "forwarded"),
    "deeply nested body": (post(f"/ng-rollout/b1{CHAT}", b"[" * 5000 + b"]" * 5000), "forwarded"),
    "huge header": (post(f"/ng-rollout/b1{CHAT}", extra="X-Big: " + "a" * 100_000 + "\r\n"), "rejected"),
    "Content-Length and Transfer-Encoding": (post(f"/ng-rollout/b1{CHAT}", extra="Transfer-Encoding: chunked\r\n"), "rejected"),
    "two different Content-Lengths": (post(f"/ng-rollout/b1{CHAT}", extra="Content-Length: 5\r\n"), "rejected"),
    "obfuscated Transfer-Encoding": (b"POST /ng-rollout/b1/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                     b"Transfer-Encoding: xchunked\r\nConnection: close\r\n\r\n0\r\n\r\n", "rejected"),
    # RFC 9112 §3.2.2: accepted; its path goes to the configured upstream, never to the host it names.
    "absolute-form target": (b"GET http://elsewhere.invalid/v1/models HTTP/1.1\r\nHost: elsewhere.invalid\r\n"
                             b"Connection: close\r\n\r\n", "only upstream"),
    "absolute-form with prefix": (b"POST http://elsewhere.invalid/ng-rollout/b1/v1/chat/completions HTTP/1.1\r\n"
                                  b"Host: elsewhere.invalid\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", "only upstream"),
    "no Host (HTTP/1.1)": (b"GET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n", "rejected"),
    "two Hosts": (b"GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n", "rejected"),
    "HTTP/1.0 with Transfer-Encoding": (b"POST /ng-rollout/b1/v1/chat/completions HTTP/1.0\r\nHost: x\r\n"
                                        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", "rejected"),
    "spoofed Host": (post(f"/ng-rollout/b1{CHAT}", extra="").replace(b"Host: sidecar", b"Host: evil.example"), "only upstream"),
    "not HTTP at all": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64), "rejected"),
    "SSE garbage from upstream": (post("/ng-rollout/b2/v1/responses"), "forwarded"),
})


async def _exchange(url: str, raw: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(raw)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 10)
    except (ConnectionError, asyncio.TimeoutError):
        return b""
    finally:
        writer.close()


def _files_under(path) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), path) for d, _, files in os.walk(path) for f in files}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_bad_input(case, upstream, sidecar, http, capture_dir, tmp_path):
    raw, expected = CASES[case]
    upstream.scripts[CHAT] = json_script(b'{"ok": true}')
    upstream.scripts["/v1/models"] = json_script(b'{"data": []}')
    upstream.scripts["/v1/responses"] = sse_script(b"", [os.urandom(300), b"\n\ndata: {not json\n\n", b"\x00\xff\r\r"])
    reply = await _exchange(sidecar.url, raw)
    status = reply.split(b" ", 2)[1] if reply.startswith(b"HTTP/1.1 ") else b""
    if expected == "local 400":
        assert status == b"400" and b"invalid rollout id" in reply and upstream.received == []
    elif expected == "rejected":
        assert status in (b"400", b"413", b"431", b"501", b"") and upstream.received == []
    elif expected == "forwarded":
        assert status == b"200" and len(upstream.received) == 1
        body = raw.split(b"\r\n\r\n", 1)[1]
        assert upstream.received[0].body == body, "the body reaches the upstream unchanged"
    else:  # only upstream: whatever the client claims, the configured upstream is the only host reached
        assert status == b"200" and all(r.header("Host") == upstream.url.removeprefix("http://") for r in upstream.received)
    assert (await http.get(sidecar.url + "/-/healthy")).status == 200, "the sidecar stays up"
    outside = {name for name in _files_under(tmp_path) if not name.startswith("captures" + os.sep)}
    assert outside == set(), f"files written outside the capture dir: {outside}"
    for name in rollout_files(capture_dir):
        assert name in ("b1.capture.jsonl", "b2.capture.jsonl"), name
