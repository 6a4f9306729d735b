"""The seven wire defects of issue 17, each held by a regression test named after it.

Raw sockets on both sides: a raw upstream that writes exactly the bytes a test gives it (1xx
replies, HEAD replies framed as chunked, a close right after reading a POST), and raw clients
that see every byte the sidecar sends.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional

import pytest

CHAT = "/v1/chat/completions"
Reply = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]


@dataclass
class RawUpstream:
    """Answers the n-th request with ``replies[n]`` (a coroutine that writes the reply and says
    whether to keep the connection); records every request's raw bytes and connection number."""

    replies: list[Reply] = field(default_factory=list)
    received: list[tuple[int, bytes]] = field(default_factory=list)
    connections: int = 0
    server: Optional[asyncio.base_events.Server] = None

    async def start(self) -> "RawUpstream":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                request = head + (await reader.readexactly(length) if length else b"")
                self.received.append((number, request))
                reply = self.replies[len(self.received) - 1]
                if not await reply(request, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        self.server.close()  # type: ignore[union-attr]


def sized(body: bytes, status: bytes = b"200 OK", keep: bool = True, before: bytes = b"", pause: float = 0) -> Reply:
    async def reply(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if before:
            writer.write(before)
            await writer.drain()
            await asyncio.sleep(pause)
        writer.write(b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body))
        await writer.drain()
        return keep
    return reply


@pytest.fixture
async def raw_upstream():
    server = await RawUpstream().start()
    yield server
    await server.close()


async def exchange(url: str, data: bytes, until: Callable[[bytes], bool], timeout: float = 10) -> bytes:
    """Send raw ``data`` to ``url``; read until ``until(received)`` or the connection closes."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(data)
    received = b""
    try:
        async with asyncio.timeout(timeout):
            while not until(received):
                chunk = await reader.read(65536)
                if not chunk:
                    break
                received += chunk
    finally:
        writer.close()
    return received


def post(path: str, body: bytes = b'{"model": "m"}', extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nHost: s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        path.encode(), len(body), extra, body)


def ends_with(suffix: bytes) -> Callable[[bytes], bool]:
    return lambda received: received.endswith(suffix)


async def test_interim_1xx_reply_never_ends_the_call_nor_leaks_into_the_next(raw_upstream, start, capture_dir):
    """103 Early Hints before the 200: the client gets the 200 and its whole body (the 1xx is
    skipped, as nginx does), and the next call on the pooled connection gets only its own bytes."""
    raw_upstream.replies = [sized(b"first", before=b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n", pause=0.2),
                            sized(b"second")]
    sidecar = await start(raw_upstream.url, capture_dir=capture_dir)
    one = await exchange(sidecar.url, post("/ng-rollout/a/v1/x"), ends_with(b"first"))
    two = await exchange(sidecar.url, post("/ng-rollout/a/v1/x"), ends_with(b"second"))
    assert one.startswith(b"HTTP/1.1 200 OK\r\n") and one.endswith(b"\r\n\r\nfirst") and b"103" not in one
    assert two.startswith(b"HTTP/1.1 200 OK\r\n") and two.endswith(b"\r\n\r\nsecond") and b"first" not in two
    assert [number for number, _ in raw_upstream.received] == [1, 1], "the connection was reused only after its end"


async def test_header_value_that_never_ends_is_refused_at_64_KiB(raw_upstream, start, capture_dir):
    """Counted as the bytes arrive: 431 long before 48 MiB, and nothing upstream."""
    sidecar = await start(raw_upstream.url, capture_dir=capture_dir)
    host, port = sidecar.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET / HTTP/1.1\r\nHost: s\r\nX-Big: ")
    for _ in range(16):  # 256 KiB of one header value, in 16 KiB pieces, never ending.
        writer.write(b"a" * 16384)
        await writer.drain()
    reply = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert reply.startswith(b"HTTP/1.1 431 ") and b"Connection: close" in reply
    assert raw_upstream.received == []


async def test_slowloris_head_gets_408_at_the_head_timeout(raw_upstream, start, capture_dir):
    """A head trickled byte by byte is cut at the head deadline, though every byte resets the idle timer."""
    sidecar = await start(raw_upstream.url, capture_dir=capture_dir, head_timeout=0.6)
    host, port = sidecar.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    loop = asyncio.get_running_loop()
    started = loop.time()
    writer.write(b"GET / HTTP/1.1\r\nHost: s\r\n")

    async def trickle() -> None:
        with pytest.raises(ConnectionError):
            for _ in range(100):
                await asyncio.sleep(0.05)
                writer.write(b"X")
                await writer.drain()

    task = asyncio.create_task(trickle())
    reply = await asyncio.wait_for(reader.read(), 10)
    elapsed = loop.time() - started
    task.cancel()
    writer.close()
    assert reply.startswith(b"HTTP/1.1 408 Request Timeout\r\n") and 0.5 < elapsed < 5
    assert raw_upstream.received == []


async def test_connections_over_the_bound_are_closed_on_arrival(raw_upstream, start, capture_dir):
    sidecar = await start(raw_upstream.url, capture_dir=capture_dir, max_connections=2)
    host, port = sidecar.url.removeprefix("http://").split(":")
    held = [await asyncio.open_connection(host, int(port)) for _ in range(2)]
    await asyncio.sleep(0.1)
    reader, writer = await asyncio.open_connection(host, int(port))
    assert await asyncio.wait_for(reader.read(), 5) == b"", "closed without a byte"
    writer.close()
    for _, held_writer in held:
        held_writer.close()


async def test_post_is_never_sent_twice_when_a_reused_connection_closes(raw_upstream, start, capture_dir):
    """The upstream reads a whole POST on a reused connection and closes without replying: 502,
    and the POST reached it once (a resend would generate twice). A GET is resent, as nginx does."""
    async def read_and_close(request: bytes, writer: asyncio.StreamWriter) -> bool:
        return False
    raw_upstream.replies = [sized(b"ok"), read_and_close, sized(b"ok"), read_and_close, sized(b"again")]
    sidecar = await start(raw_upstream.url, capture_dir=capture_dir)
    assert (await exchange(sidecar.url, post("/ng-rollout/p/v1/x"), ends_with(b"ok"))).endswith(b"ok")
    second = await exchange(sidecar.url, post("/ng-rollout/p/v1/x"), ends_with(b"}"))
    assert second.startswith(b"HTTP/1.1 502 ")
    assert len(raw_upstream.received) == 2, "the POST was not sent again"
    assert (await exchange(sidecar.url, post("/ng-rollout/p/v1/x"), ends_with(b"ok"))).endswith(b"ok")
    get = await exchange(sidecar.url, b"GET /ng-rollout/p/v1/models HTTP/1.1\r\nHost: s\r\n\r\n", ends_with(b"again"))
    assert get.endswith(b"again") and len(raw_upstream.received) == 5, "the GET went once more, on a new connection"


async def test_a_pooled_connection_the_upstream_closed_is_not_reused(raw_upstream, start, capture_dir):
    """uvicorn closes idle keep-alive connections (after 5 s): the FIN already on the socket is
    seen before reuse, so the next POST goes on a new connection and succeeds."""
    async def reply_then_close_soon(request: bytes, writer: asyncio.StreamWriter) -> bool:
        await sized(b"one")(request, writer)
        await asyncio.sleep(0.05)
        return False  # The upstream's idle close, while the sidecar holds the connection in its pool.
    raw_upstream.replies = [reply_then_close_soon, sized(b"two")]
    sidecar = await start(raw_upstream.url, capture_dir=capture_dir)
    await exchange(sidecar.url, post("/ng-rollout/q/v1/x"), ends_with(b"one"))
    await asyncio.sleep(0.3)
    assert (await exchange(sidecar.url, post("/ng-rollout/q/v1/x"), ends_with(b"two"))).endswith(b"two")
    assert [number for number, _ in raw_upstream.received] == [1, 2]


def test_the_upstream_idle_timeout_is_a_setting_below_uvicorns_keep_alive():
    from proxy import load_settings
    assert load_settings({"upstream": "http://u:1"}, environ={}).upstream_idle_timeout < 5
    assert load_settings({"upstream": "http://u:1", "upstream_idle_timeout": 1.5}, environ={}).upstream_idle_timeout == 1.5


async def test_head_reply_framed_chunked_gets_no_stray_last_chunk(raw_upstream, start, capture_dir):
    """uvicorn (h11) and hypercorn frame a streaming route's HEAD reply as chunked: no body, no
    `0\\r\\n\\r\\n`, and the next reply on the connection is intact."""
    async def head_chunked(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        return True
    raw_upstream.replies = [head_chunked, sized(b"after")]
    sidecar = await start(raw_upstream.url, capture_dir=capture_dir)
    both = await exchange(sidecar.url, b"HEAD /ng-rollout/h/v1/stream HTTP/1.1\r\nHost: s\r\n\r\n"
                                       b"GET /ng-rollout/h/v1/models HTTP/1.1\r\nHost: s\r\n\r\n", ends_with(b"after"))
    head_reply, _, rest = both.partition(b"\r\n\r\n")
    assert head_reply.startswith(b"HTTP/1.1 200 OK") and b"Transfer-Encoding: chunked" in head_reply
    assert rest.startswith(b"HTTP/1.1 200 OK\r\n") and rest.endswith(b"\r\n\r\nafter"), rest


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
async def test_204_and_304_carry_no_body_framing(raw_upstream, start, capture_dir, status):
    async def bodiless(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 %s\r\nETag: \"x\"\r\n\r\n" % status)
        return True
    raw_upstream.replies = [bodiless, sized(b"next")]
    sidecar = await start(raw_upstream.url, capture_dir=capture_dir)
    both = await exchange(sidecar.url, b"GET /a HTTP/1.1\r\nHost: s\r\n\r\nGET /b HTTP/1.1\r\nHost: s\r\n\r\n", ends_with(b"next"))
    first, _, rest = both.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 " + status) and b"Transfer-Encoding" not in first
    assert rest.startswith(b"HTTP/1.1 200 OK\r\n")


@pytest.mark.parametrize("request_bytes", [
    b"POST /ng-rollout/u/v1/chat/completions HTTP/1.1\r\nHost: s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Content-Length: 5\r\n\r\nhello",
    b"GET /ng-rollout/u/v1/models HTTP/1.1\r\nHost: s\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
], ids=["post-upgrade-websocket", "get-upgrade-h2c", "connect"])
async def test_upgrade_and_connect_get_501_and_nothing_goes_upstream(raw_upstream, start, capture_dir, request_bytes):
    sidecar = await start(raw_upstream.url, capture_dir=capture_dir)
    reply = await exchange(sidecar.url, request_bytes, lambda received: False)
    assert reply.startswith(b"HTTP/1.1 501 Not Implemented\r\n") and b"Connection: close" in reply
    await asyncio.sleep(0.1)
    assert raw_upstream.received == []


async def test_upgrade_refused_in_its_turn_after_a_pipelined_request(raw_upstream, start, capture_dir):
    raw_upstream.replies = [sized(b"first", pause=0)]
    sidecar = await start(raw_upstream.url, capture_dir=capture_dir)
    reply = await exchange(sidecar.url, post("/ng-rollout/u/v1/x") +
                           b"GET /x HTTP/1.1\r\nHost: s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", lambda r: False)
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and b"first" + b"HTTP/1.1 501 Not Implemented\r\n" in reply
    assert len(raw_upstream.received) == 1


async def test_100_continue_goes_to_http11_only(raw_upstream, start, capture_dir):
    raw_upstream.replies = [sized(b"ok"), sized(b"ok")]
    sidecar = await start(raw_upstream.url, capture_dir=capture_dir)
    body = b'{"model": "m"}'
    old = b"POST /ng-rollout/c/v1/x HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    reply = await exchange(sidecar.url, old, ends_with(b"ok"))
    assert b"100 Continue" not in reply and reply.startswith(b"HTTP/1.1 200 OK")
    host, port = sidecar.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /ng-rollout/c/v1/x HTTP/1.1\r\nHost: s\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(body)
    assert (await asyncio.wait_for(reader.readuntil(b"ok"), 5)).startswith(b"HTTP/1.1 200 OK")
    writer.close()


async def test_100_continue_for_a_pipelined_request_waits_for_its_turn(raw_upstream, start, capture_dir):
    """The interim reply of request 2 never lands inside request 1's chunked body: it goes after it."""
    async def slow_stream(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for number in range(4):
            data = b"data: %d\n\n" % number
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()
            await asyncio.sleep(0.1)
        writer.write(b"0\r\n\r\n")
        return True
    raw_upstream.replies = [slow_stream, sized(b"second")]
    sidecar = await start(raw_upstream.url, capture_dir=capture_dir)
    host, port = sidecar.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = b'{"n": 2}'
    writer.write(b"GET /ng-rollout/c/v1/stream HTTP/1.1\r\nHost: s\r\n\r\n"
                 b"POST /ng-rollout/c/v1/x HTTP/1.1\r\nHost: s\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
    first = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
    assert b"100 Continue" not in first and first.count(b"data: ") == 4
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(body)
    assert (await asyncio.wait_for(reader.readuntil(b"second"), 5)).startswith(b"HTTP/1.1 200 OK")
    writer.close()


async def test_chunked_reply_with_trailers_reaches_the_client_whole_and_the_connection_stays_usable(raw_upstream, start, capture_dir):
    """Trailers are not forwarded (nginx drops them too); the body is whole and the pooled upstream
    connection carries the next reply intact."""
    async def with_trailers(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
                     b"5\r\nhello\r\n6\r\n world\r\n0\r\nX-Checksum: abc\r\n\r\n")
        return True
    raw_upstream.replies = [with_trailers, sized(b"next")]
    sidecar = await start(raw_upstream.url, capture_dir=capture_dir)
    first = await exchange(sidecar.url, b"GET /t HTTP/1.1\r\nHost: s\r\n\r\n", ends_with(b"0\r\n\r\n"))
    head, _, body = first.partition(b"\r\n\r\n")
    chunks, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        chunks, rest = chunks + rest[:size], rest[size + 2:]
    assert chunks == b"hello world" and b"X-Checksum: abc" not in first
    second = await exchange(sidecar.url, b"GET /u HTTP/1.1\r\nHost: s\r\n\r\n", ends_with(b"next"))
    assert second.endswith(b"\r\n\r\nnext") and [n for n, _ in raw_upstream.received] == [1, 1]


@pytest.mark.parametrize("target, path", [
    ("http://h/v1/models", "/v1/models"), ("HTTPS://h:8443/a?b=1", "/a?b=1"), ("http://h", "/"), ("http://h?x=1", "/?x=1"),
    ("http://h/ng-rollout/r1/v1/chat/completions", "/ng-rollout/r1/v1/chat/completions"),
    ("ftp://h/x", None), ("*", None), ("h/x", None), ("http:///x", None),
])
def test_the_path_of_an_absolute_form_target(target, path):
    """RFC 9112 §3.2.2: the absolute-form is accepted; only its path and query are forwarded."""
    from proxy.call import origin_form
    assert origin_form(target) == path


async def test_a_refused_upgrade_is_said_once_with_its_path(raw_upstream, start, capture_dir, caplog):
    """A WebSocket that is not the Responses WebSocket mode on a prefixed path (here: no rollout
    prefix) gets its 501, nothing goes upstream, and the log says why, once per path."""
    import logging

    sidecar = await start(raw_upstream.url, capture_dir=capture_dir)
    ws = (b"GET /said/v1/responses HTTP/1.1\r\nHost: s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
          b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    with caplog.at_level(logging.WARNING, logger="mcc"):
        for _ in range(2):
            reply = await exchange(sidecar.url, ws, lambda received: False)
            assert reply.startswith(b"HTTP/1.1 501 Not Implemented\r\n")
    assert raw_upstream.received == []
    said = [r.getMessage() for r in caplog.records if "with 501" in r.getMessage()]
    assert said == ["refused GET /said/v1/responses with 501: Upgrade: websocket is not served (only HTTP/1.1 requests "
                    "are forwarded, and the Responses WebSocket mode on /ng-rollout/<rollout_id>/v1/responses)"], said
