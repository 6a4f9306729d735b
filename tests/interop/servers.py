"""Real upstream servers for the interop suite, started on loopback per test session.

uvicorn with ``--http h11`` and ``--http httptools``, hypercorn (all serving `asgi_app`), uvicorn
over TLS with a certificate from a test CA (trustme), and nginx, both as a static-file server
(an upstream) and as a reverse proxy in front of an upstream (the reference a proxy is held to).
A server whose program is missing is skipped with a message, never failed.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}: {process.stderr.read() if process.stderr else ''}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_asgi(kind: str, certfile: Optional[str] = None, keyfile: Optional[str] = None) -> Server:
    """``uvicorn-h11``, ``uvicorn-httptools`` or ``hypercorn`` serving `asgi_app` on a free port."""
    port = free_port()
    if kind.startswith("uvicorn"):
        command = [sys.executable, "-m", "uvicorn", "tests.interop.asgi_app:app", "--host", "127.0.0.1", "--port", str(port),
                   "--http", kind.split("-")[1], "--log-level", "warning", "--timeout-keep-alive", "5"]
        if certfile:
            command += ["--ssl-certfile", certfile, "--ssl-keyfile", keyfile]  # type: ignore[list-item]
    else:
        command = [sys.executable, "-m", "hypercorn", "tests.interop.asgi_app:app", "--bind", f"127.0.0.1:{port}",
                   "--log-level", "warning"]
    root = os.path.dirname(os.path.dirname(HERE))
    process = subprocess.Popen(command, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_port(port, process)
    scheme = "https" if certfile else "http"
    return Server(kind, f"{scheme}://127.0.0.1:{port}", process)


def nginx_path() -> Optional[str]:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.path.exists(p)), None)


def start_nginx(workdir: str, location: str) -> Server:
    """nginx with one server block whose ``location /`` is ``location`` (static root or proxy_pass)."""
    binary = nginx_path()
    assert binary is not None
    port = free_port()
    os.makedirs(workdir, exist_ok=True)
    # Run as root (CI), nginx's workers would switch to `nobody`, who cannot read pytest's tmp dirs.
    user = "user root;" if os.geteuid() == 0 else ""
    config = f"""
{user}
worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {workdir}/body; proxy_temp_path {workdir}/proxy;
  fastcgi_temp_path {workdir}/fcgi; uwsgi_temp_path {workdir}/uwsgi; scgi_temp_path {workdir}/scgi;
  server_tokens off;
  server {{
    listen 127.0.0.1:{port};
    location / {{ {location} }}
  }}
}}
"""
    path = os.path.join(workdir, "nginx.conf")
    with open(path, "w", encoding="ascii") as handle:
        handle.write(config)
    process = subprocess.Popen([binary, "-c", path, "-p", workdir], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_port(port, process)
    return Server("nginx", f"http://127.0.0.1:{port}", process)
