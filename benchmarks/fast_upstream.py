"""A fast stand-in upstream for the benchmark: a raw asyncio protocol writing pre-built replies.

    python benchmarks/fast_upstream.py PORT

It must never be the bottleneck, so it does the least an HTTP/1.1 server can: keep-alive, a
Content-Length or chunked request body, and one of three pre-built replies chosen by the body:
``"stream":true`` -> 256 chat events (chunked), ``"logprob_stream":true`` -> 256 vLLM-shaped
events with logprobs and token ids (about 80 KB, one write), ``"batch":true`` -> an 8,000-token RL stream at
`BATCH_TOKENS_PER_S`, ``"hold":true`` -> one event then silence until the
client leaves, ``"rl":true`` -> a vLLM-shaped 32,000-token RL stream (one logprob entry and one
token id per chunk, `prompt_token_ids` on the first) written at `RL_TOKENS_PER_S`, anything
else -> a 1 KB JSON chat completion.
"""

from __future__ import annotations

import asyncio
import sys

import orjson

EVENTS = 256
RL_TOKENS = 32_000
#: Pace of each RL stream: several times what one vLLM sequence generates, to load the sidecar.
RL_TOKENS_PER_S = 4_000
#: ``"batch":true``: one of 256 sequences of a full vLLM batch (issue 20), 8,000 tokens at a pace
#: that makes 256 of them ~50k tokens/s in all (a large GPU server's decode rate).
BATCH_TOKENS = 8_000
BATCH_TOKENS_PER_S = 200
#: ``"gpu_pace":true``: what one sequence of a 256-sequence batch gets from one GPU (an 8B model
#: on an H100 decodes ~13k tokens/s at that batch size: ~50 tokens/s per sequence).
GPU_TOKENS_PER_S = 50
#: ``"memory":true``: one of vLLM's default batch on an H100 (1,024 sequences) of 12,000 tokens each
#: (issue 34's memory target), at a pace that keeps all 1,024 open together on a 2-core machine.
MEMORY_TOKENS = 12_000
MEMORY_TOKENS_PER_S = 60
#: Events written together every 1 / (RL_TOKENS_PER_S / RL_BATCH) seconds.
RL_BATCH = 40


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


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def rl_events(tokens: int = RL_TOKENS) -> list[bytes]:
    """The SSE events of one RL generation, as vLLM writes them (see tests/transcripts.py)."""
    head = {"id": "chatcmpl-rl", "object": "chat.completion.chunk", "created": 1767225600, "model": "bench"}
    events = [b"data: " + orjson.dumps({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                               "logprobs": None, "finish_reason": None}],
                                        "prompt_token_ids": list(range(100, 2100))}) + b"\n\n"]
    for i in range(tokens):
        text = f" t{i}"
        events.append(b"data: " + orjson.dumps({**head, "choices": [{
            "index": 0, "delta": {"content": text},
            "logprobs": {"content": [{"token": text, "logprob": -0.125, "bytes": list(text.encode()), "top_logprobs": []}]},
            "finish_reason": "stop" if i == tokens - 1 else None, "token_ids": [1000 + i % 150000]}]}) + b"\n\n")
    events.append(b"data: " + orjson.dumps({**head, "choices": [], "usage": {
        "prompt_tokens": 2000, "completion_tokens": tokens, "total_tokens": 2000 + tokens}}) + b"\n\n")
    return events + [b"data: [DONE]\n\n"]


RL_CHUNKS: list[bytes] = []  # Built on first use: 13 MB.
#: ``"logprob_stream":true``: 256 vLLM-shaped events (a logprob entry and a token id in every
#: chunk, the prompt's ids on the first), written whole at once (issue 34): about 80 KB.
LOGPROB_STREAM = HEAD + b"".join(_chunked(event) for event in rl_events(EVENTS - 3)) + b"0\r\n\r\n"
BATCH_CHUNKS: list[bytes] = []
MEMORY_CHUNKS: list[bytes] = []


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
        if b'"memory":true' in body:
            if not MEMORY_CHUNKS:
                MEMORY_CHUNKS.extend(_chunked(event) for event in rl_events(MEMORY_TOKENS))
            self.transport.write(HEAD)  # type: ignore[attr-defined]
            self._pace(0, MEMORY_CHUNKS, MEMORY_TOKENS_PER_S)
        elif b'"batch":true' in body:  # One sequence of a full vLLM batch: 8k tokens, at a GPU's pace.
            if not BATCH_CHUNKS:
                BATCH_CHUNKS.extend(_chunked(event) for event in rl_events(BATCH_TOKENS))
            self.transport.write(HEAD)  # type: ignore[attr-defined]
            self._pace(0, BATCH_CHUNKS, GPU_TOKENS_PER_S if b'"gpu_pace":true' in body else BATCH_TOKENS_PER_S)
        elif b'"rl":true' in body:
            if not RL_CHUNKS:
                RL_CHUNKS.extend(_chunked(event) for event in rl_events())
            self.transport.write(HEAD)  # type: ignore[attr-defined]
            self._pace(0)
        elif b'"logprob_stream":true' in body:
            self.transport.write(LOGPROB_STREAM)  # type: ignore[attr-defined]
        elif b'"hold":true' in body:
            self.transport.write(HEAD + FIRST)  # type: ignore[attr-defined]
        elif b'"stream":true' in body:
            self.transport.write(HEAD + FIRST)  # type: ignore[attr-defined]
            self.transport.writelines(EVENT_CHUNKS)  # type: ignore[attr-defined]
            self.transport.write(LAST)  # type: ignore[attr-defined]
        else:
            self.transport.write(JSON_REPLY)  # type: ignore[attr-defined]


    def _pace(self, start: int, chunks: list[bytes] | None = None, per_second: int = RL_TOKENS_PER_S) -> None:
        chunks = RL_CHUNKS if chunks is None else chunks
        if self.transport.is_closing():  # type: ignore[attr-defined]
            return
        self.transport.writelines(chunks[start:start + RL_BATCH])  # type: ignore[attr-defined]
        if start + RL_BATCH < len(chunks):
            asyncio.get_running_loop().call_later(RL_BATCH / per_second, self._pace, start + RL_BATCH, chunks, per_second)
        else:
            self.transport.write(b"0\r\n\r\n")  # type: ignore[attr-defined]


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
