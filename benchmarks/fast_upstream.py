"""A fast stand-in upstream for the benchmark: a raw asyncio protocol writing pre-built replies.

    python benchmarks/fast_upstream.py PORT

It must never be the bottleneck, so it does the least an HTTP/1.1 server can: keep-alive, a
Content-Length or chunked request body, and one of three pre-built replies chosen by the body:
``"stream":true`` -> 256 chat events (chunked), ``"hold":true`` -> one event then silence until the
client leaves, anything else -> a 1 KB JSON chat completion.
"""

from __future__ import annotations

import asyncio
import sys

import orjson

EVENTS = 256


def _json_reply() -> bytes:
    body = orjson.dumps({"id": "chatcmpl-bench", "object": "chat.completion", "created": 1767225600, "model": "bench",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": "word " * 160}}],
                         "usage": {"prompt_tokens": 20, "completion_tokens": 160, "total_tokens": 180}})
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def _event(delta: dict) -> bytes:
    data = b"data: " + orjson.dumps({"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1767225600,
                                     "model": "bench", "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}) + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
FIRST = _event({"role": "assistant", "content": ""})
EVENT_CHUNKS = [_event({"content": f" tok{i}"}) for i in range(EVENTS - 2)]
LAST = b"%x\r\n%s\r\n0\r\n\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n")
JSON_REPLY = _json_reply()


class Upstream(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                line_end = head.find(b"\r\n", at)
                length = int(head[at + 15:line_end if line_end > 0 else None])
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4:end + 4 + length]
            self.buffer = self.buffer[end + 4 + length:]
            self.reply(body)

    def reply(self, body: bytes) -> None:
        if b'"hold":true' in body:
            self.transport.write(HEAD + FIRST)  # type: ignore[attr-defined]
        elif b'"stream":true' in body:
            self.transport.write(HEAD + FIRST)  # type: ignore[attr-defined]
            self.transport.writelines(EVENT_CHUNKS)  # type: ignore[attr-defined]
            self.transport.write(LAST)  # type: ignore[attr-defined]
        else:
            self.transport.write(JSON_REPLY)  # type: ignore[attr-defined]


async def main(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Upstream, "127.0.0.1", port, backlog=4096)
    print("ready", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop
        uvloop.run(main(int(sys.argv[1])))
    except ImportError:
        asyncio.run(main(int(sys.argv[1])))
