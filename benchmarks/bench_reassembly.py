"""Micro-benchmark: SSE parse + reassembly (the tap) per dialect, on one core.

    python benchmarks/bench_reassembly.py

Streams are synthesised in the shape real servers send (one event per chunk, as vLLM writes
them) and also fed in 4 KiB chunks (what a loaded TCP connection delivers). Each figure is the
best of several runs; the printout is a markdown table of events/s and MB/s.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import orjson  # noqa: E402

from capture import StreamTap  # noqa: E402

EVENTS = 5000
ROUNDS = 15


def _sse(name: str | None, payload: object) -> bytes:
    data = payload if isinstance(payload, str) else orjson.dumps(payload).decode()
    return (f"event: {name}\n" if name else "").encode() + f"data: {data}\n\n".encode()


def chat_events() -> list[bytes]:
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1767225600, "model": "Qwen/Qwen3-8B"}
    events = [_sse(None, {**head, "choices": [{"index": 0, "delta": {"content": f" token{i}"}, "logprobs": None,
                                               "finish_reason": None}]}) for i in range(EVENTS)]
    return events + [_sse(None, "[DONE]")]


def responses_events() -> list[bytes]:
    def event(kind: str, number: int, **fields: object) -> bytes:
        return _sse(kind, {"type": kind, "sequence_number": number, **fields})

    response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    events = [event("response.created", 0, response=response),
              event("response.output_item.added", 1, output_index=0,
                    item={"id": "msg_1", "type": "message", "role": "assistant", "content": []}),
              event("response.content_part.added", 2, output_index=0, item_id="msg_1", content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []})]
    events += [event("response.output_text.delta", 3 + i, output_index=0, item_id="msg_1", content_index=0,
                     delta=f" token{i}", logprobs=[]) for i in range(EVENTS)]
    return events + [event("response.completed", EVENTS + 3, response={**response, "status": "completed"})]


def messages_events() -> list[bytes]:
    events = [_sse("message_start", {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                                                                          "content": [], "usage": {"input_tokens": 10, "output_tokens": 1}}}),
              _sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})]
    events += [_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": f" token{i}"}}) for i in range(EVENTS)]
    return events + [_sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
                     _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": EVENTS}}),
                     _sse("message_stop", {"type": "message_stop"})]


def best_seconds(dialect: str, chunks: list[bytes], templates: bool = True) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        tap = StreamTap(dialect, templates=templates)
        for chunk in chunks:
            tap.feed(chunk)
        outcome = tap.finish(200)
        best = min(best, time.perf_counter() - started)
        assert outcome.error_category is None, outcome
    return best


def main() -> None:
    print(f"# Tap throughput (parse + reassemble), one core, Python {sys.version.split()[0]}\n")
    print("Event templates (issue 34) take runs of a stream's repeated chunk in one read; chat learns them,")
    print("the other dialects parse every event. 'general' is the same tap with templates off.\n")
    print("| dialect | chunking | events | events/s | MB/s | events/s, general | templates / general |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for dialect, build in (("chat", chat_events), ("responses", responses_events), ("messages", messages_events)):
        events = build()
        body = b"".join(events)
        for label, chunks in (("one event per chunk", events), ("4 KiB chunks", [body[i:i + 4096] for i in range(0, len(body), 4096)]),
                              ("64 KiB chunks", [body[i:i + 65536] for i in range(0, len(body), 65536)])):
            seconds = best_seconds(dialect, chunks)
            general = best_seconds(dialect, chunks, templates=False)
            print(f"| {dialect} | {label} | {len(events)} | {len(events) / seconds:,.0f} | {len(body) / seconds / 1e6:.1f} "
                  f"| {len(events) / general:,.0f} | {general / seconds:.2f} |")


if __name__ == "__main__":
    main()
