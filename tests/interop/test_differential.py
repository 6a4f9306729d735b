"""Differential interop: real servers, real clients, the sidecar in between (issue 17).

For every (upstream server, client, case) the client's view through the sidecar -- status,
reason, end-to-end headers in order and case, body bytes -- equals its view of the same upstream
directly. Two things cannot be equal and are left out of the comparison: ``Date`` (a real
server stamps each reply with the time) and the hop-by-hop headers (RFC 9110 §7.6.1), which a
proxy owns; where framing must differ (an HTTP/1.0 client, HEAD, 204) the result is held to what
nginx does in front of the same upstream instead (`test_framing_matches_nginx_in_front_of_the_same_upstream`).

Servers: uvicorn (``--http h11`` and ``--http httptools``) and hypercorn serving `asgi_app`,
nginx serving static files, uvicorn over TLS with a test CA (the sidecar trusts it through
``--upstream-ca``). Clients: curl, httpx (sync and async, one connection reused), requests,
aiohttp, the openai and anthropic SDKs, pipelined raw sockets. The sidecars are subprocesses, so
blocking clients can drive them.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import aiohttp
import h11
import httpx
import pytest
import requests

from records import CaptureStore
from tests.processes import SidecarProcess

from . import asgi_app
from .servers import Server, nginx_path, start_asgi, start_nginx

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}
#: Left out of every comparison: a real server stamps each reply with the time.
VOLATILE = {"date"}
ASGI_SERVERS = ["uvicorn-h11", "uvicorn-httptools", "hypercorn"]


@dataclass(frozen=True)
class View:
    """What a client saw: status, reason, end-to-end headers (in order, with their case), body."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    body: bytes


def view(status: int, reason: str, headers: Iterator[tuple[str, str]], body: bytes) -> View:
    kept = tuple((k, v) for k, v in headers if k.lower() not in HOP_BY_HOP | VOLATILE)
    return View(status, reason, kept, body)


# -- the servers ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def upstreams(tmp_path_factory) -> Iterator[dict[str, Server]]:
    servers = {name: start_asgi(name) for name in ASGI_SERVERS}
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture(scope="module")
def sidecars(upstreams, tmp_path_factory) -> Iterator[dict[str, SidecarProcess]]:
    capture_dir = tmp_path_factory.mktemp("interop-captures")
    running = {name: SidecarProcess.start("--upstream", server.url, "--capture-dir", str(capture_dir))
               for name, server in upstreams.items()}
    yield running
    for sidecar in running.values():
        sidecar.terminate()


def through(sidecars: dict[str, SidecarProcess], name: str, path: str) -> str:
    """The sidecar URL for ``path`` of upstream ``name``: prefixed when the path is a model call."""
    base = sidecars[name].url
    return f"{base}/ng-rollout/interop-{name}{path}" if path.startswith("/v1/") else base + path


# -- the clients ---------------------------------------------------------------------------------

def with_curl(url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None) -> View:
    with tempfile.TemporaryDirectory() as scratch:
        head_file, body_file = os.path.join(scratch, "h"), os.path.join(scratch, "b")
        command = ["curl", "-s", "-S", "--http1.1", "-X", method, "-D", head_file, "-o", body_file, url]
        if method == "HEAD":
            command[command.index("-X"):command.index("-X") + 2] = ["-I"]
        for key, value in (headers or {}).items():
            command += ["-H", f"{key}: {value}"]
        if body is not None:
            command += ["--data-binary", "@-"]
        subprocess.run(command, input=body, check=True, capture_output=True, timeout=60)
        with open(head_file, "rb") as handle:
            head = handle.read().decode("latin-1").split("\r\n\r\n")[-2 if method != "HEAD" else 0]
        raw_body = open(body_file, "rb").read() if os.path.exists(body_file) else b""
    status_line, *lines = head.split("\r\n")
    _, status, reason = (status_line.split(" ", 2) + [""])[:3]
    return view(int(status), reason, (tuple(line.split(": ", 1)) for line in lines if ": " in line), raw_body)


def with_httpx(url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None) -> View:
    with httpx.Client(timeout=60) as client:
        response = client.request(method, url, content=body, headers=headers)
        raw = response.read()
    return view(response.status_code, response.reason_phrase,
                ((k.decode("latin-1"), v.decode("latin-1")) for k, v in response.headers.raw), raw)


def with_requests(url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None) -> View:
    with requests.Session() as session:
        response = session.request(method, url, data=body, headers=headers, stream=True, timeout=60)
        raw = response.raw.read(decode_content=False)
    return view(response.status_code, response.reason, response.raw.headers.items(), raw)


def with_aiohttp(url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None) -> View:
    async def fetch() -> View:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            async with session.request(method, url, data=body, headers=headers) as response:
                raw = await response.read()
                return view(response.status, response.reason or "",
                            ((k.decode("latin-1"), v.decode("latin-1")) for k, v in response.raw_headers), raw)
    return asyncio.run(fetch())


CLIENTS: dict[str, Callable[..., View]] = {"curl": with_curl, "httpx": with_httpx, "requests": with_requests,
                                           "aiohttp": with_aiohttp}
CASES = {
    "json": ("GET", "/json", None),
    "post-echo-1MB": ("POST", "/echo", os.urandom(1 << 20)),
    "sse-with-delays": ("GET", "/sse", None),
    "5MB": ("GET", "/big", None),
    "204": ("GET", "/empty", None),
    "304": ("GET", "/etag", None),
    "HEAD-of-a-stream": ("HEAD", "/sse", None),
    "connection-close": ("GET", "/close", None),
    "gzip": ("GET", "/gzip", None),
    "404": ("GET", "/nothing-here", None),
    "chat-json": ("POST", "/v1/chat/completions", b'{"model": "m", "messages": []}'),
    "chat-stream": ("POST", "/v1/chat/completions", b'{"model": "m", "stream": true, "messages": []}'),
}


# curl -I prints only a head: HEAD is compared through the other three clients.
MATRIX = [(client, case) for client in sorted(CLIENTS) for case in sorted(CASES)
          if not (client == "curl" and CASES[case][0] == "HEAD")]


@pytest.mark.slow
@pytest.mark.parametrize("client,case", MATRIX)
@pytest.mark.parametrize("server", ASGI_SERVERS)
def test_through_the_sidecar_equals_direct(upstreams, sidecars, server, client, case):
    method, path, body = CASES[case]
    headers = {"Content-Type": "application/json"} if body else None
    fetch = CLIENTS[client]
    direct = fetch(upstreams[server].url + path, method, body, headers)
    proxied = fetch(through(sidecars, server, path), method, body, headers)
    assert proxied == direct


@pytest.mark.slow
def test_httpx_async_and_sync_reuse_one_connection_for_many_calls(upstreams, sidecars):
    """A pooled client's keep-alive connection carries a mix of replies (204, HEAD, stream, 5 MB)."""
    paths = ["/json", "/empty", "/sse", "/big", "/etag", "/json"]

    def run_sync(base: str) -> list[View]:
        with httpx.Client(base_url=base, timeout=60, limits=httpx.Limits(max_connections=1)) as client:
            out = []
            for path in paths:
                response = client.get(path)
                out.append(view(response.status_code, response.reason_phrase,
                                ((k.decode(), v.decode()) for k, v in response.headers.raw), response.content))
            out.append(view(client.head("/sse").status_code, "", (), b""))
            return out

    async def run_async(base: str) -> list[View]:
        async with httpx.AsyncClient(base_url=base, timeout=60, limits=httpx.Limits(max_connections=1)) as client:
            out = []
            for path in paths:
                response = await client.get(path)
                out.append(view(response.status_code, response.reason_phrase,
                                ((k.decode(), v.decode()) for k, v in response.headers.raw), response.content))
            return out

    for name in ASGI_SERVERS:
        assert run_sync(sidecars[name].url) == run_sync(upstreams[name].url)
        assert asyncio.run(run_async(sidecars[name].url)) == asyncio.run(run_async(upstreams[name].url))


@pytest.mark.slow
def test_the_official_sdks_parse_the_same(upstreams, sidecars):
    from anthropic import Anthropic
    from openai import OpenAI
    for name in ASGI_SERVERS:
        seen = []
        for base in (upstreams[name].url, f"{sidecars[name].url}/ng-rollout/sdk-{name}"):
            with Anthropic(base_url=base, api_key="k", max_retries=0) as client:
                whole = client.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
                with client.messages.stream(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as stream:
                    final = stream.get_final_message()
            seen.append((whole.model_dump(), final.model_dump()))
        assert seen[0] == seen[1] and seen[0][1]["content"][0]["text"] == "Hello there"
        results = []
        for base in (upstreams[name].url + "/v1", f"{sidecars[name].url}/ng-rollout/sdk-{name}/v1"):
            with OpenAI(base_url=base, api_key="k", max_retries=0) as client:
                whole = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
                chunks = [c.model_dump() for c in client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], stream=True)]
            results.append((whole.model_dump(), chunks))
        assert results[0] == results[1]


def _pipelined(url: str, requests_bytes: bytes, count: int) -> list[View]:
    """Send every request in one write; parse ``count`` replies with h11."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(requests_bytes)
        connection = h11.Connection(h11.CLIENT)
        # h11 models one request at a time: it is told of each (already sent) GET in its turn.
        connection.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
        connection.send(h11.EndOfMessage())
        replies: list[View] = []
        current: dict = {}
        while len(replies) < count:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(sock.recv(65536))
            elif isinstance(event, h11.Response):
                current = {"status": event.status_code, "reason": event.reason.decode(),
                           "headers": [(k.decode(), v.decode()) for k, v in event.headers.raw_items()], "body": b""}
            elif isinstance(event, h11.Data):
                current["body"] += event.data
            elif isinstance(event, h11.EndOfMessage):
                replies.append(view(current["status"], current["reason"], iter(current["headers"]), current["body"]))
                if len(replies) < count:
                    connection.start_next_cycle()
                    connection.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
                    connection.send(h11.EndOfMessage())
    return replies


def test_pipelined_requests_on_a_raw_socket(upstreams, sidecars):
    batch = (b"GET /json HTTP/1.1\r\nHost: x\r\n\r\n"
             b"GET /sse HTTP/1.1\r\nHost: x\r\n\r\n"
             b"GET /empty HTTP/1.1\r\nHost: x\r\n\r\n"
             b"GET /json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    for name in ("uvicorn-h11", "uvicorn-httptools"):  # hypercorn does not answer pipelined requests in order
        assert _pipelined(sidecars[name].url, batch, 4) == _pipelined(upstreams[name].url, batch, 4)


def test_a_reset_mid_stream_reaches_the_client_as_a_cut_with_the_same_bytes(upstreams, sidecars):
    def received_before_the_cut(url: str) -> tuple[bytes, bool]:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"GET /reset HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while True:
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return body, body.endswith(b"0\r\n\r\n")
    for name in ("uvicorn-h11", "uvicorn-httptools"):
        direct_body, direct_clean = received_before_the_cut(upstreams[name].url)
        proxied_body, proxied_clean = received_before_the_cut(sidecars[name].url)
        assert not direct_clean and not proxied_clean, "neither ends like a complete reply"
        assert b"data: 1" in direct_body and b"data: 1" in proxied_body


@pytest.mark.slow
def test_an_upstream_that_closes_idle_keep_alive_connections_loses_no_call(tmp_path):
    """uvicorn with a 1 s keep-alive, a sidecar told 30 s: the FIN peek still keeps every POST whole."""
    server = start_asgi("uvicorn-httptools")
    server.stop()
    port = int(server.url.rsplit(":", 1)[1])
    import sys
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", "tests.interop.asgi_app:app", "--port", str(port),
                                "--timeout-keep-alive", "1", "--log-level", "warning"],
                               cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from .servers import wait_for_port
    wait_for_port(port, process)
    sidecar = SidecarProcess.start("--upstream", f"http://127.0.0.1:{port}", "--capture-dir", str(tmp_path),
                                   "--upstream-idle-timeout", "30")
    try:
        with httpx.Client(timeout=30) as client:
            for _ in range(4):
                response = client.post(f"{sidecar.url}/ng-rollout/idle/v1/chat/completions", content=b'{"model": "m"}')
                assert response.status_code == 200
                time.sleep(1.3)  # Longer than uvicorn's keep-alive: it has closed the pooled connection.
    finally:
        sidecar.terminate()
        process.terminate()
        process.wait(timeout=10)


# -- HTTPS upstream ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_an_https_upstream_with_a_private_ca(tmp_path):
    trustme = pytest.importorskip("trustme")
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile, cafile = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    certificate.cert_chain_pems[0].write_to_path(str(certfile))
    certificate.private_key_pem.write_to_path(str(keyfile))
    authority.cert_pem.write_to_path(str(cafile))
    server = start_asgi("uvicorn-httptools", certfile=str(certfile), keyfile=str(keyfile))
    sidecar = SidecarProcess.start("--upstream", server.url, "--upstream-ca", str(cafile), "--capture-dir", str(tmp_path / "c"))
    untrusting = SidecarProcess.start("--upstream", server.url, "--capture-dir", str(tmp_path / "u"))
    try:
        for path in ("/json", "/sse", "/big", "/v1/chat/completions"):
            method, body = ("POST", b'{"model": "m", "stream": true}') if path.startswith("/v1/") else ("GET", None)
            import ssl
            with httpx.Client(verify=ssl.create_default_context(cafile=str(cafile)), timeout=60) as client:
                direct = client.request(method, server.url + path, content=body)
            proxied = with_httpx(sidecar.url + (f"/ng-rollout/tls{path}" if path.startswith("/v1/") else path), method, body)
            assert proxied == view(direct.status_code, direct.reason_phrase,
                                   ((k.decode(), v.decode()) for k, v in direct.headers.raw), direct.content)
        refused = with_httpx(untrusting.url + "/ng-rollout/tls/v1/chat/completions", "POST", b'{"model": "m"}')
        assert refused.status == 502 and b"--upstream-ca" in refused.body, "no CA: a clear 502 that names the flag"
        # Issue 21, point 3: readiness tells the truth (every call would fail), and the line says
        # the failure is not worth retrying.
        ready = with_httpx(untrusting.url + "/-/ready")
        assert ready.status == 503 and b"--upstream-ca" in ready.body and b"does not verify" in ready.body
        (line,) = CaptureStore(str(tmp_path / "u")).read("tls")
        assert line["failure"]["retryable"] is False and "--upstream-ca" in line["failure"]["message"]
        assert with_httpx(sidecar.url + "/-/ready").status == 200, "with the CA: ready"
    finally:
        sidecar.terminate()
        untrusting.terminate()
        server.stop()


def test_a_missing_ca_file_is_refused_at_startup(tmp_path):
    import sys
    done = subprocess.run([sys.executable, "-m", "proxy", "serve", "--upstream", "https://127.0.0.1:1",
                           "--upstream-ca", str(tmp_path / "nope.pem")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "invalid --upstream-ca" in done.stderr and "cannot load a CA bundle" in done.stderr


# -- nginx: as an upstream (static files), and as the reference for framing ---------------------------

requires_nginx = pytest.mark.skipif(nginx_path() is None, reason="nginx is not installed (.ci/run installs it with apt-get)")


@requires_nginx
def test_nginx_static_files_through_the_sidecar(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    (root / "data.json").write_bytes(asgi_app.JSON)
    (root / "big.bin").write_bytes(asgi_app.BIG)
    nginx = start_nginx(str(tmp_path / "nginx"), f"root {root};")
    sidecar = SidecarProcess.start("--upstream", nginx.url)
    try:
        assert with_curl(nginx.url + "/data.json").status == 200
        for client in CLIENTS.values():
            for method, path in (("GET", "/data.json"), ("GET", "/big.bin"), ("GET", "/missing")):
                assert client(sidecar.url + path, method) == client(nginx.url + path, method)
        seen = with_curl(nginx.url + "/data.json")
        etag = {k.lower(): v for k, v in seen.headers}.get("etag")
        assert etag, seen
        conditional = {"If-None-Match": etag}
        assert with_httpx(sidecar.url + "/data.json", headers=conditional) == with_httpx(nginx.url + "/data.json", headers=conditional)
        assert with_httpx(sidecar.url + "/data.json", headers=conditional).status == 304
        ranged = {"Range": "bytes=10-19"}
        assert with_httpx(sidecar.url + "/big.bin", headers=ranged) == with_httpx(nginx.url + "/big.bin", headers=ranged)
        assert with_httpx(sidecar.url + "/big.bin", "HEAD") == with_httpx(nginx.url + "/big.bin", "HEAD")
    finally:
        sidecar.terminate()
        nginx.stop()


def _raw(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _framing(reply: bytes) -> tuple[str, bool, bool, bytes]:
    """(status line, chunked?, has a Content-Length?, body) of a raw reply read until close."""
    head, _, body = reply.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {line.split(":", 1)[0].lower() for line in lines[1:]}
    return lines[0], "transfer-encoding" in fields, "content-length" in fields, body


def _ours_and_nginxs(upstream_url: str, sidecar_url: str, request_bytes: bytes, directory) -> tuple:
    """The framing of the reply to ``request_bytes`` from the sidecar, and from nginx in front of the same upstream."""
    nginx = start_nginx(str(directory), f"proxy_pass {upstream_url}; proxy_http_version 1.1; "
                                        "proxy_set_header Connection \"\"; proxy_buffering off;")
    try:
        return _framing(_raw(sidecar_url, request_bytes)), _framing(_raw(nginx.url, request_bytes))
    finally:
        nginx.stop()


@requires_nginx
@pytest.mark.parametrize("request_bytes", [
    b"GET /sse HTTP/1.0\r\nHost: x\r\n\r\n",  # HTTP/1.0 client, chunked upstream: de-chunked, ends with the close
    b"HEAD /sse HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",  # HEAD of a stream: no body, no last chunk
    b"GET /empty HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",  # 204: no body, no framing
    b"GET /etag HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",  # 304: no body, no framing
], ids=["http10-client", "HEAD-stream", "204", "304"])
def test_framing_matches_nginx_in_front_of_the_same_upstream(upstreams, sidecars, tmp_path, request_bytes):
    """Where the bytes cannot equal a direct call's (framing is hop-by-hop), they equal nginx's."""
    for name in ("uvicorn-h11", "hypercorn"):
        ours, reference = _ours_and_nginxs(upstreams[name].url, sidecars[name].url, request_bytes, tmp_path / f"nginx-{name}")
        assert ours[0].split(" ", 1)[1] == reference[0].split(" ", 1)[1]  # The status (nginx writes HTTP/1.1 too)
        if request_bytes.startswith(b"HEAD"):
            assert ours[3] == reference[3] == b""
        else:
            assert ours[1:] == reference[1:], (ours, reference)


@requires_nginx
@pytest.mark.parametrize("request_bytes", [
    b"GET /json HTTP/1.1\r\nConnection: close\r\n\r\n",  # RFC 9112 §3.2: no Host in HTTP/1.1
    b"GET /json HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n",  # two Hosts
    b"POST /json HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",  # 1.0 + chunked
    b"GET http://elsewhere.invalid/json HTTP/1.1\r\nHost: elsewhere.invalid\r\nConnection: close\r\n\r\n",  # absolute-form
    b"GET /json HTTP/1.0\r\n\r\n",  # HTTP/1.0 without Host: allowed
], ids=["no-host", "two-hosts", "http10-transfer-encoding", "absolute-form", "http10-no-host"])
def test_the_status_of_an_irregular_request_is_nginxs(upstreams, sidecars, tmp_path, request_bytes):
    """RFC 9112's last gaps (issue 21, point 9): what nginx refuses with 400 the sidecar refuses, and
    an absolute-form target is served (its path, from the configured upstream), as nginx serves it."""
    name = "uvicorn-h11"
    ours, reference = _ours_and_nginxs(upstreams[name].url, sidecars[name].url, request_bytes, tmp_path / "nginx")
    assert ours[0].split(" ", 2)[1] == reference[0].split(" ", 2)[1], (ours[0], reference[0])
    if ours[0].split(" ", 2)[1] == "200":
        assert ours[3] == reference[3], "the same body, from the configured upstream"
