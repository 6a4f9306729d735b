"""Generated capture directories with known contents, for the inspection commands' tests."""

from __future__ import annotations

import os

from records import encode_capture_line


def chat_line(index: int, *, status: int = 200, error: str | None = None, finish: str = "stop",
              tool_arguments: str | None = None, started: float = 1767225600.0) -> bytes:
    message: dict = {"role": "assistant", "content": f"answer {index}"}
    if tool_arguments is not None:
        message["tool_calls"] = [{"id": f"call_{index}", "type": "function",
                                  "function": {"name": "search", "arguments": tool_arguments}}]
    response = {"id": f"chatcmpl-{index}", "object": "chat.completion", "model": "policy",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110,
                          "prompt_tokens_details": {"cached_tokens": 64 if index % 2 == 0 else 0}}}
    return encode_capture_line({
        "model_call_id": f"{index:032x}", "dialect": "chat", "model_ref": {"type": "responses_api_models", "name": "policy"},
        "started_at": started + index, "completed_at": started + index + 0.5, "latency_ms": 500.0 + index,
        "latency_ttft_ms": 50.0 + index, "status_code": status, "error_category": error,
        "request": {"model": "policy", "messages": [{"role": "user", "content": f"question {index}"}]},
        "response": response if status == 200 else {"error": {"message": "boom"}},
    })


def make_capture_dir(path: str, rollouts: int, calls: int) -> None:
    """`rollouts` files of `calls` lines: every 10th call a 500, every 5th a tool call (every 3rd of
    those with arguments that are not JSON), every 4th cut by length."""
    os.makedirs(path, exist_ok=True)
    for r in range(rollouts):
        lines = []
        for i in range(calls):
            tool = ('{"q": "x"}' if i % 3 else "{not json") if i % 5 == 0 else None
            lines.append(chat_line(i, status=500 if i % 10 == 9 else 200, error="upstream_error" if i % 10 == 9 else None,
                                   finish="length" if i % 4 == 0 else "stop", tool_arguments=tool))
        with open(os.path.join(path, f"rollout-{r:04d}.capture.jsonl"), "wb") as handle:
            handle.write(b"".join(lines))
