"""The upstream app the interop suite serves with real servers (uvicorn h11 / httptools, hypercorn).

Plain ASGI (no framework), so each route's bytes are exactly what the server makes of them:
JSON, SSE with delays, 5 MB, 204, 304, a streamed reply (HEAD-able), Connection: close, gzip,
a reset mid-stream, and an OpenAI-shaped chat completion (whole and streamed) for the SDKs.
"""

from __future__ import annotations

import asyncio
import gzip
import json

BIG = b"0123456789abcdef" * (5 * 1024 * 1024 // 16)
JSON = json.dumps({"id": "x1", "object": "thing", "text": "h\u00e9llo \u2603"}).encode()
GZIPPED = gzip.compress(JSON * 50, mtime=0)


def _chat(stream: bool) -> list[bytes]:
    head = {"id": "chatcmpl-i", "object": "chat.completion.chunk", "created": 1767225600, "model": "m"}
    if not stream:
        return [json.dumps({"id": "chatcmpl-i", "object": "chat.completion", "created": 1767225600, "model": "m",
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there"},
                                         "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).encode()]
    events = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {"content": " there"}, "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
              {**head, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}]
    return [b"data: " + json.dumps(event).encode() + b"\n\n" for event in events] + [b"data: [DONE]\n\n"]


def _messages(stream: bool) -> list[bytes]:
    message = {"id": "msg_i", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
               "stop_sequence": None, "content": [{"type": "text", "text": "Hello there"}],
               "usage": {"input_tokens": 3, "output_tokens": 2}}
    if not stream:
        return [json.dumps(message).encode()]

    def event(name: str, payload: dict) -> bytes:
        return b"event: %s\ndata: %s\n\n" % (name.encode(), json.dumps({"type": name, **payload}).encode())
    return [event("message_start", {"message": {**message, "content": [], "stop_reason": None}}),
            event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
            event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hello"}}),
            event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": " there"}}),
            event("content_block_stop", {"index": 0}),
            event("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 2}}),
            event("message_stop", {})]


#: The model routes the SDKs call: whole JSON, or the events of a stream.
_MODEL_ROUTES = {"/v1/chat/completions": _chat, "/v1/messages": _messages}


async def app(scope, receive, send):  # noqa: C901 -- one route table, read top to bottom
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path, method = scope["path"], scope["method"]

    async def whole(status: int, headers: list[tuple[bytes, bytes]], content: bytes) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def streamed(status: int, headers: list[tuple[bytes, bytes]], pieces: list[bytes], delay: float = 0.0) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            if delay:
                await asyncio.sleep(delay)
        await send({"type": "http.response.body", "body": b""})

    if path == "/json":
        await whole(200, [(b"content-type", b"application/json"), (b"x-Mixed-Case", b"Kept")], JSON)
    elif path == "/echo":
        await whole(200, [(b"content-type", b"application/octet-stream")], body)
    elif path == "/sse":
        await streamed(200, [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
                       [b"data: %d\n\n" % n for n in range(5)], delay=0.02)
    elif path == "/big":
        await whole(200, [(b"content-type", b"application/octet-stream")], BIG)
    elif path == "/empty":
        await send({"type": "http.response.start", "status": 204, "headers": [(b"x-empty", b"1")]})
        await send({"type": "http.response.body", "body": b""})
    elif path == "/etag":
        await send({"type": "http.response.start", "status": 304, "headers": [(b"etag", b'"v1"')]})
        await send({"type": "http.response.body", "body": b""})
    elif path == "/close":
        await whole(200, [(b"content-type", b"text/plain"), (b"connection", b"close")], b"closing")
    elif path == "/gzip":
        await whole(200, [(b"content-type", b"application/json"), (b"content-encoding", b"gzip")], GZIPPED)
    elif path == "/reset":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        raise RuntimeError("the model server died mid-stream")  # The server aborts the connection.
    elif path in _MODEL_ROUTES:
        build = _MODEL_ROUTES[path]
        if json.loads(body or b"{}").get("stream"):
            await streamed(200, [(b"content-type", b"text/event-stream")], build(True), delay=0.005)
        else:
            await whole(200, [(b"content-type", b"application/json")], build(False)[0])
    else:
        await whole(404, [(b"content-type", b"application/json")], b'{"detail":"Not Found"}')
    del method
