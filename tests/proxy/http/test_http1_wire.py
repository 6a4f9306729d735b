"""The sidecar's own HTTP/1.1 (proxy/http/_server.py, proxy/http/_upstream.py) on the wire: framings and
connection handling a library used to do for us, each compared byte for byte with the upstream."""

from __future__ import annotations

import asyncio

import orjson

from tests.scripted_upstream import Script, json_script
from tests.transcripts import CHAT_JSON, CHAT_JSON_REQUEST
from tests.wire import assert_same_reply, fetch, rollout_url

CHAT = "/v1/chat/completions"


async def _raw_exchange(url: str, payload: bytes, until: bytes = b"\x00never", count: int = 1, timeout: float = 10) -> bytes:
    """Write ``payload`` on one connection; read until ``until`` was seen ``count`` times, or EOF."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(payload)
    received = b""
    try:
        while received.count(until) < count:
            data = await asyncio.wait_for(reader.read(65536), timeout)
            if not data:
                break
            received += data
    finally:
        writer.close()
    return received


def _post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s"
            % (path.encode(), len(body), extra, body))


async def test_pipelined_requests_are_answered_in_order_on_one_connection(upstream, sidecar, store):
    bodies = [orjson.dumps({"n": n}) for n in range(3)]
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    payload = b"".join(_post(f"/ng-rollout/p/v1/chat/completions?n={n}", body) for n, body in enumerate(bodies))
    received = await _raw_exchange(sidecar.url, payload, until=CHAT_JSON, count=3)
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 3 and received.count(CHAT_JSON) == 3
    assert [r.body for r in upstream.received] == bodies, "one at a time, in the order sent"
    assert [line["request"] for line in store.read("p")] == [{"n": 0}, {"n": 1}, {"n": 2}]


async def test_expect_100_continue_gets_its_interim_reply_then_the_upstream_reply(upstream, sidecar, store):
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    host, port = sidecar.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = _post("/ng-rollout/e/v1/chat/completions", CHAT_JSON_REQUEST, b"Expect: 100-continue\r\n")
    writer.write(head[: head.index(b"\r\n\r\n") + 4])
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(CHAT_JSON_REQUEST)
    reply = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert reply.startswith(b"HTTP/1.1 200 OK") and await reader.readexactly(len(CHAT_JSON)) == CHAT_JSON
    writer.close()
    assert upstream.received[0].header("Expect") is None, "the interim reply was ours; upstream gets no Expect"
    assert upstream.received[0].body == CHAT_JSON_REQUEST and len(store.read("e")) == 1


async def test_head_replies_have_no_body_and_the_connection_stays_usable(http, upstream, sidecar):
    upstream.scripts["/v1/models"] = json_script(b'{"data": []}')
    direct = await fetch(http, "HEAD", upstream.url + "/v1/models")
    proxied = await fetch(http, "HEAD", sidecar.url + "/v1/models")
    assert_same_reply(direct, proxied)
    assert proxied.body == b"" and proxied.header("Content-Length") == "12"
    after = await fetch(http, "GET", sidecar.url + "/v1/models")
    assert after.status == 200 and after.body == b'{"data": []}'


async def test_a_body_ended_by_the_upstream_closing_reaches_the_client_whole(http, upstream, sidecar, store):
    """No Content-Length, no chunking: the body ends when the upstream closes (HTTP/1.0 style)."""
    upstream.scripts[CHAT] = Script(headers=[("Content-Type", "application/json")], pieces=[CHAT_JSON[:20], CHAT_JSON[20:]],
                                    pause=0.02, ending="close")
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_JSON_REQUEST)
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "c", CHAT), CHAT_JSON_REQUEST)
    assert_same_reply(direct, proxied)
    (line,) = store.read("c")
    assert line["response"] == orjson.loads(CHAT_JSON) and line["error_category"] is None


async def test_an_idle_upstream_connection_closed_by_the_upstream_is_not_a_failed_call(http, upstream, sidecar, store):
    """The upstream closes its keep-alive connection after a reply; the next call opens a new one."""
    upstream.scripts[CHAT] = Script(headers=[("Content-Type", "application/json"), ("Content-Length", str(len(CHAT_JSON)))],
                                    pieces=[CHAT_JSON], ending="close")
    for _ in range(3):
        reply = await fetch(http, "POST", rollout_url(sidecar.url, "k", CHAT), CHAT_JSON_REQUEST)
        assert reply.status == 200 and reply.body == CHAT_JSON
        await asyncio.sleep(0.05)
    assert [line["status_code"] for line in store.read("k")] == [200, 200, 200]
    assert upstream.connections == 3


async def test_an_http_1_0_client_gets_its_reply_and_a_closed_connection(upstream, sidecar):
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    payload = (b"POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
               % (len(CHAT_JSON_REQUEST), CHAT_JSON_REQUEST))
    received = await _raw_exchange(sidecar.url, payload)
    assert received.startswith(b"HTTP/1.1 200 OK") and received.endswith(CHAT_JSON), "the whole reply, then EOF"


async def test_an_oversized_request_head_is_refused_with_431(upstream, sidecar):
    payload = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
    received = await _raw_exchange(sidecar.url, payload, until=b"\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 431 ") and upstream.received == []


async def test_an_http_1_0_client_gets_a_chunked_upstream_body_unframed_then_the_close(upstream, sidecar):
    """HTTP/1.0 has no chunked coding: the body goes as it is and the connection's close ends it."""
    events = b'data: {"a": 1}\n\ndata: [DONE]\n\n'
    upstream.scripts["/v1/stream"] = Script(headers=[("Content-Type", "text/event-stream")], pieces=[events[:9], events[9:]],
                                            chunked=True, pause=0.02)
    payload = b"GET /v1/stream HTTP/1.0\r\n\r\n"
    received = await _raw_exchange(sidecar.url, payload)
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"chunked" not in head.lower() and body == events


async def test_a_kept_alive_upstream_connection_idle_past_the_read_timeout_is_reused(http, upstream, start, capture_dir, store):
    """The read timeout times a reply, not the pool: an idle connection neither times out nor spins."""
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    sidecar = await start(upstream.url, capture_dir=capture_dir, read_timeout=0.2)
    for _ in range(2):
        reply = await fetch(http, "POST", rollout_url(sidecar.url, "idle", CHAT), CHAT_JSON_REQUEST)
        assert reply.status == 200 and reply.body == CHAT_JSON
        await asyncio.sleep(0.5)
    assert upstream.connections == 1
    assert [line["error_category"] for line in store.read("idle")] == [None, None]


async def test_an_idle_client_connection_is_closed_after_the_idle_timeout_and_a_busy_one_is_not(upstream):
    """A forgotten keep-alive connection (or a head never finished) is closed; a slow reply is not cut."""
    from proxy import Settings, Sidecar

    upstream.scripts["/v1/slow"] = json_script(b"{}", delay_head=0.6)
    sidecar = Sidecar(Settings(upstream=upstream.url, port=0))
    sidecar.idle_timeout = 0.3
    url = await sidecar.start()
    host, port = url.removeprefix("http://").split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /v1/sl")  # A head never finished.
        assert await asyncio.wait_for(reader.read(), 5) == b"", "closed by the sidecar"
        busy = await _raw_exchange(url, b"GET /v1/slow HTTP/1.1\r\nHost: x\r\n\r\n", until=b"{}")
        assert busy.startswith(b"HTTP/1.1 200 OK") and busy.endswith(b"{}"), "a reply slower than the idle timeout"
    finally:
        await sidecar.close()
