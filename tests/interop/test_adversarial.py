"""An adversarial corpus: hostile or broken request bytes get a clear 4xx, and nothing goes upstream.

Each case is written to a raw socket as is; the upstream records every request that reaches it.
(Slowloris and the never-ending header are in tests/proxy/http/test_wire_rules.py, with short limits.)
"""

from __future__ import annotations

import asyncio

import pytest

from tests.proxy.http.test_wire_rules import RawUpstream, exchange, sized

H = b"Host: s\r\n"
CHAT = b"/ng-rollout/adv/v1/chat/completions"

CORPUS: dict[str, bytes] = {
    # Request smuggling: two framings, or one framing hidden from some parsers.
    "CL.TE": b"POST %s HTTP/1.1\r\n%sContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nX" % (CHAT, H),
    "TE.CL": b"POST %s HTTP/1.1\r\n%sTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n" % (CHAT, H),
    "TE.TE obfuscated value": b"POST %s HTTP/1.1\r\n%sTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n" % (CHAT, H),
    "TE chunked not last": b"POST %s HTTP/1.1\r\n%sTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n" % (CHAT, H),
    "TE with space before colon": b"POST %s HTTP/1.1\r\n%sTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n" % (CHAT, H),
    "two Content-Lengths": b"POST %s HTTP/1.1\r\n%sContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}" % (CHAT, H),
    "Content-Length with a sign": b"POST %s HTTP/1.1\r\n%sContent-Length: +2\r\n\r\n{}" % (CHAT, H),
    "negative Content-Length": b"POST %s HTTP/1.1\r\n%sContent-Length: -1\r\n\r\n{}" % (CHAT, H),
    "chunk size overflow": b"POST %s HTTP/1.1\r\n%sTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff1\r\nx\r\n0\r\n\r\n" % (CHAT, H),
    "chunk size not hex": b"POST %s HTTP/1.1\r\n%sTransfer-Encoding: chunked\r\n\r\nzz\r\nx\r\n0\r\n\r\n" % (CHAT, H),
    # Bytes a header must not hold.
    "NUL in a header value": b"GET /v1/models HTTP/1.1\r\n%sX-A: a\x00b\r\n\r\n" % H,
    "bare CR in a header value": b"GET /v1/models HTTP/1.1\r\n%sX-A: a\rb\r\n\r\n" % H,
    "LF in a header name": b"GET /v1/models HTTP/1.1\r\n%sX\nA: b\r\n\r\n" % H,
    "obs-fold continuation line": b"GET /v1/models HTTP/1.1\r\n%sX-A: a\r\n b\r\n\r\n" % H,
    "space in a header name": b"GET /v1/models HTTP/1.1\r\n%sX A: b\r\n\r\n" % H,
    # Limits.
    "URI over 64 KiB": b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n" + H + b"\r\n",
    "head over 64 KiB in many headers": b"GET / HTTP/1.1\r\n" + H + b"".join(b"X-%d: %s\r\n" % (n, b"v" * 100) for n in range(700)) + b"\r\n",
    # Not HTTP/1.1.
    "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "invalid method": b"G@T / HTTP/1.1\r\n%s\r\n" % H,
    "HTTP/9.9": b"GET / HTTP/9.9\r\n%s\r\n" % H,
    "no version": b"GET /\r\n%s\r\n" % H,
}


@pytest.fixture
async def recording_upstream():
    server = await RawUpstream(replies=[sized(b"{}") for _ in range(4)]).start()
    yield server
    await server.close()


@pytest.mark.parametrize("case", sorted(CORPUS))
async def test_hostile_bytes_get_a_clear_4xx_and_nothing_upstream(case, recording_upstream, start, capture_dir):
    sidecar = await start(recording_upstream.url, capture_dir=capture_dir)
    reply = await exchange(sidecar.url, CORPUS[case], lambda received: False, timeout=10)
    status = reply[9:12]
    assert reply.startswith(b"HTTP/1.1 4") or reply.startswith(b"HTTP/1.1 501"), (case, reply[:200])
    assert b"Connection: close" in reply.partition(b"\r\n\r\n")[0], "the connection closes after a refusal"
    await asyncio.sleep(0.05)
    assert recording_upstream.received == [], (case, status)
    healthy = await exchange(sidecar.url, b"GET /-/healthy HTTP/1.1\r\nHost: s\r\nConnection: close\r\n\r\n", lambda r: False)
    assert healthy.startswith(b"HTTP/1.1 200"), "the sidecar stays up"
