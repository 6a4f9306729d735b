"""The walk of one warm call (issue 43): what the event loop runs of the project's code for it.

    python benchmarks/trace_call.py [--calls N] [--json]

A sidecar in this process, capture on, in front of a tiny upstream in another process that answers
every request with the same streamed chat reply (16 events and a usage chunk, one write). After
warm-up calls, one streamed chat call is traced on the event loop's thread with `sys.setprofile`
(the capture process and the writer threads are other processes and threads: not traced), then
the same with the token capture mode on (`--capture-tokens`). It prints, per case:

- calls: Python calls into the project's code (`proxy/`, `capture/`, `records/`);
- functions, files: how many distinct ones those calls reached;
- hops: calls whose caller is project code in another file (a call that crosses a module);
- training calls: calls into `proxy/training/` (with the mode off there must be none; on a checkout
  before the layers, into the modules it was made of);
- loop CPU per call: the event loop thread's CPU time over ``--calls`` sequential calls from a
  client in another process, divided by their number (capture off, capture on, token mode on).

Counts are exact for a given checkout (run it twice: the same figures); the CPU figures are times
on a shared machine: compare them only with figures of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PROJECT = tuple(os.path.join(ROOT, package) + os.sep for package in ("proxy", "capture", "records"))
#: The training features' code: `proxy/training/`, and the modules it was made of before the
#: layers (issue 43), so that a run on an older checkout counts the same code.
TRAINING = (os.path.join(ROOT, "proxy", "training") + os.sep,
            *(os.path.join(ROOT, "proxy", name) for name in ("_token_call.py", "_token_mode.py", "_token_capture.py",
                                                            "_prefix_supply.py", "_weight_versions.py")))

UPSTREAM = textwrap.dedent(r'''
    import asyncio, json, sys
    def event(delta, finish=None, usage=None):
        chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                 "choices": [] if usage else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if usage:
            chunk["usage"] = usage
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
    events = [event({"role": "assistant", "content": ""})]
    events += [event({"content": f"word{i} "}) for i in range(15)]
    events += [event({}, "stop"), event({}, usage={"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}),
               b"data: [DONE]\n\n"]
    body = b"".join(events)
    STREAM = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
              + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
    class Upstream(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buffer = transport, b""
        def data_received(self, data):
            self.buffer += data
            while b"\r\n\r\n" in self.buffer:
                head, _, rest = self.buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(rest) < length:
                    return
                self.buffer = rest[length:]
                self.transport.write(STREAM)
    async def main(port):
        server = await asyncio.get_running_loop().create_server(Upstream, "127.0.0.1", port)
        print("ready", flush=True)
        await server.serve_forever()
    asyncio.run(main(int(sys.argv[1])))
''')

CLIENT = textwrap.dedent(r'''
    import socket, sys, time
    host, port, calls, body = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode()
    request = (b"POST /ng-rollout/bench-walk/v1/chat/completions HTTP/1.1\r\nHost: s\r\n"
               b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    sock = socket.create_connection((host, port))
    for _ in range(calls):
        sock.sendall(request)
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            data += sock.recv(65536)
    sock.close()
''')

BODY = b'{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def one_call(url: str) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /ng-rollout/bench-walk/v1/chat/completions HTTP/1.1\r\nHost: s\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
    data = b""
    while not data.endswith(b"0\r\n\r\n"):
        data += await reader.read(65536)
    writer.close()
    return data


class Walk:
    """`sys.setprofile` hook: every call into the project's code, and who called it."""

    def __init__(self) -> None:
        self.calls = 0
        self.hops = 0
        self.training = 0
        self.functions: Counter[tuple[str, str]] = Counter()
        self.files: Counter[str] = Counter()
        self.hop_pairs: Counter[tuple[str, str]] = Counter()

    def __call__(self, frame, event, arg) -> None:  # noqa: ANN001
        if event != "call":
            return
        path = frame.f_code.co_filename
        if not path.startswith(PROJECT):
            return
        self.calls += 1
        self.functions[(path, frame.f_code.co_name)] += 1
        self.files[path] += 1
        if path.startswith(TRAINING):
            self.training += 1
        caller = frame.f_back
        if caller is not None and caller.f_code.co_filename.startswith(PROJECT) and caller.f_code.co_filename != path:
            self.hops += 1
            self.hop_pairs[(caller.f_code.co_filename, path)] += 1


async def trace(url: str) -> Walk:
    for _ in range(20):  # Warm: pools, templates, caches.
        await one_call(url)
    await asyncio.sleep(0.2)
    walk = Walk()
    sys.setprofile(walk)
    try:
        await one_call(url)
        await asyncio.sleep(0.05)  # The line's settlement comes back to the loop.
    finally:
        sys.setprofile(None)
    return walk


async def loop_cpu(url: str, calls: int) -> float:
    """µs of the loop thread's CPU per call, the client in another process."""
    host, port = url.removeprefix("http://").split(":")
    started = time.thread_time()
    client = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT, host, port, str(calls), BODY.decode())
    await client.wait()
    await asyncio.sleep(0.1)
    return (time.thread_time() - started) / calls * 1e6


async def run_case(upstream: str, capture: bool, tokens: bool, calls: int) -> tuple[Walk | None, float]:
    from proxy import Settings, start_sidecar

    with tempfile.TemporaryDirectory(prefix="mcc-walk-") as capture_dir:
        settings = Settings(upstream=upstream, port=0, capture_dir=capture_dir if capture else None,
                            capture_enabled=capture, capture_tokens=tokens)
        server = await start_sidecar(settings)
        try:
            walk = await trace(server.url) if capture else None
            cpu = await loop_cpu(server.url, calls)
        finally:
            await server.close()
    return walk, cpu


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="sequential calls for the loop CPU figure")
    args = parser.parse_args()
    port = free_port()
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(port)], stdout=subprocess.PIPE)
    try:
        assert upstream.stdout is not None and upstream.stdout.readline().strip() == b"ready"
        url = f"http://127.0.0.1:{port}"
        rows = []
        for name, capture, tokens in (("capture off", False, False), ("capture on", True, False),
                                      ("token mode on", True, True)):
            walk, cpu = await run_case(url, capture, tokens, args.calls)
            rows.append((name, walk, cpu))
    finally:
        upstream.kill()
    print("| case | calls | functions | files | hops | proxy/training calls | loop CPU per call (µs) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, walk, cpu in rows:
        if walk is None:
            print(f"| {name} | | | | | | {cpu:.1f} |")
        else:
            print(f"| {name} | {walk.calls} | {len(walk.functions)} | {len(walk.files)} | {walk.hops} | "
                  f"{walk.training} | {cpu:.1f} |")
    if os.environ.get("MCC_WALK_DETAIL"):
        for name, walk, _ in rows:
            if walk is None:
                continue
            print(f"\n{name}: calls per file")
            for path, count in walk.files.most_common():
                print(f"  {count:4d} {os.path.relpath(path, ROOT)}")
            print(f"\n{name}: hops, caller's file -> callee's file")
            for (caller, callee), count in walk.hop_pairs.most_common():
                print(f"  {count:4d} {os.path.relpath(caller, ROOT)} -> {os.path.relpath(callee, ROOT)}")
            if os.environ.get("MCC_WALK_DETAIL") == "functions":
                print(f"\n{name}: calls per function")
                for (path, function), count in walk.functions.most_common():
                    print(f"  {count:4d} {os.path.relpath(path, ROOT)}:{function}")


if __name__ == "__main__":
    asyncio.run(main())
