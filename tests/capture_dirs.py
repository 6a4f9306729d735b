"""Generated capture directories with known contents, for the inspection commands' tests."""

from __future__ import annotations

import os

from records.contract import encode_capture_line


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


#: One agent turn per dialect: a system prompt, a user question, the model's earlier tool call and
#: the tool's result, then a reply with reasoning and a new tool call (issue 22's conversations).
CONVERSATIONS: dict[str, tuple[dict, dict]] = {
    "chat": (
        {"model": "policy", "tools": [{"type": "function", "function": {"name": "search", "parameters": {}}}],
         "messages": [{"role": "system", "content": "You are terse."},
                      {"role": "user", "content": "Weather in Paris?"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "call_a", "type": "function", "function": {"name": "search", "arguments": '{"q": "paris"}'}}]},
                      {"role": "tool", "tool_call_id": "call_a", "content": "18 C and sunny"}]},
        {"id": "chatcmpl-1", "object": "chat.completion", "model": "policy",
         "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
             "role": "assistant", "content": "Checking the forecast.", "reasoning_content": "The user wants tomorrow too.",
             "tool_calls": [{"id": "call_b", "type": "function", "function": {"name": "forecast", "arguments": '{"city": "Paris"}'}}]}}],
         "usage": {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}}),
    "responses": (
        {"model": "policy", "instructions": "You are terse.", "tools": [{"type": "function", "name": "search"}],
         "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
                   {"type": "function_call", "call_id": "call_a", "name": "search", "arguments": '{"q": "paris"}'},
                   {"type": "function_call_output", "call_id": "call_a", "output": "18 C and sunny"}]},
        {"id": "resp_1", "object": "response", "model": "policy", "status": "completed",
         "output": [{"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "The user wants tomorrow too."}]},
                    {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                     "content": [{"type": "output_text", "text": "Checking the forecast.", "annotations": []}]},
                    {"type": "function_call", "id": "fc_1", "call_id": "call_b", "name": "forecast", "arguments": '{"city": "Paris"}'}],
         "usage": {"input_tokens": 40, "output_tokens": 12, "total_tokens": 52}}),
    "messages": (
        {"model": "policy", "max_tokens": 64, "system": "You are terse.", "tools": [{"name": "search", "input_schema": {}}],
         "messages": [{"role": "user", "content": "Weather in Paris?"},
                      {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "search", "input": {"q": "paris"}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "18 C and sunny"}]}]},
        {"id": "msg_1", "type": "message", "role": "assistant", "model": "policy", "stop_reason": "tool_use",
         "content": [{"type": "thinking", "thinking": "The user wants tomorrow too.", "signature": "sig"},
                     {"type": "text", "text": "Checking the forecast."},
                     {"type": "tool_use", "id": "toolu_b", "name": "forecast", "input": {"city": "Paris"}}],
         "usage": {"input_tokens": 40, "output_tokens": 12}}),
    "completions": (
        {"model": "policy", "prompt": "Weather in Paris? Answer:", "max_tokens": 8},
        {"id": "cmpl-1", "object": "text_completion", "model": "policy",
         "choices": [{"index": 0, "text": " Checking the forecast.", "finish_reason": "stop", "logprobs": None}],
         "usage": {"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10}}),
}


def make_conversation_dir(path: str) -> None:
    """One rollout per dialect (``conv-<dialect>``): call 0 the turn of `CONVERSATIONS`, call 1 the
    same request whose 200 stream was cut (``stream_truncated``), call 2 a 429."""
    os.makedirs(path, exist_ok=True)
    for dialect, (request, response) in CONVERSATIONS.items():
        base = {"dialect": dialect, "model_ref": {"type": "responses_api_models", "name": "policy"}, "request": request}
        lines = [
            {**base, "model_call_id": f"{dialect}-0", "started_at": 1767225600.0, "completed_at": 1767225601.0,
             "latency_ms": 1000.0, "latency_ttft_ms": 120.0, "status_code": 200, "response": response,
             "stream_truncated": False},
            {**base, "model_call_id": f"{dialect}-1", "started_at": 1767225602.0, "completed_at": 1767225602.5,
             "latency_ms": 500.0, "latency_ttft_ms": 90.0, "status_code": 200, "error_category": "stream_truncated",
             "response": None, "stream_truncated": True, "response_source": "upstream", "upstream_status_code": 200,
             "failure": {"stage": "stream", "category": "stream_truncated", "message": "the upstream closed mid-stream",
                         "exception_type": None, "retryable": True}},
            {**base, "model_call_id": f"{dialect}-2", "started_at": 1767225603.0, "completed_at": 1767225603.1,
             "latency_ms": 100.0, "latency_ttft_ms": None, "status_code": 429, "error_category": "rate_limit",
             "response": {"error": {"message": "slow down"}}, "response_source": "upstream", "upstream_status_code": 429},
        ]
        with open(os.path.join(path, f"conv-{dialect}.capture.jsonl"), "wb") as handle:
            handle.write(b"".join(encode_capture_line(line) for line in lines))


def token_line(prompt: list[int], generated: list[int], *, n: int = 1, error: str | None = None,
               finish: str = "stop", call_id: str = "c", turn: int = 0) -> bytes:
    """A chat call as vLLM answers with ``return_token_ids`` and ``logprobs`` (choice i generates
    ``generated`` shifted by i). ``turn``: how many earlier replies (each ``x``, as every reply
    here says) its request sends back, each followed by a tool result: the call it continues is
    the one before it (lineage, docs/tokens.md); 0 is a first call."""
    history = [{"role": "user", "content": "q"}]
    for _ in range(turn):
        history += [{"role": "assistant", "content": "x"}, {"role": "user", "content": "tool says t"}]
    choices = [{"index": i, "message": {"role": "assistant", "content": "x"}, "finish_reason": finish,
                "token_ids": [g + i for g in generated],
                "logprobs": {"content": [{"token": "x", "logprob": -0.25 - i} for _ in generated]}} for i in range(n)]
    return encode_capture_line({
        "model_call_id": call_id, "dialect": "chat", "status_code": 200, "error_category": error,
        "started_at": 1767225600.0, "completed_at": 1767225601.0, "latency_ms": 1000.0,
        "request": {"model": "policy", "messages": history},
        "response": {"object": "chat.completion", "model": "policy", "prompt_token_ids": prompt, "choices": choices,
                     "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(generated)}}})


def make_token_dir(path: str, rollouts: int, calls: int, tokens: int, *, name: str = "rl", tool_tokens: int = 1) -> None:
    """``rollouts`` multi-turn rollouts of ``calls`` calls, each generating ``tokens`` ids: each
    prompt extends the previous prompt + generation + ``tool_tokens`` ids (a tool's result, say),
    except after calls 1, 4, 7..., whose next prompt lost the first token call 0 generated (it
    drifts at ``tokens``); every fourth rollout has n=2 and every fifth a torn last line, an
    incomplete marker and a retried attempt (``-a1``)."""
    os.makedirs(path, exist_ok=True)
    for r in range(rollouts):
        prompt, lines = list(range(1, 1 + tokens)), []
        for c in range(calls):
            generated = [100_000 + r * 1000 + c * 10 + k for k in range(tokens)]
            lines.append(token_line(prompt, generated, n=2 if r % 4 == 3 else 1, call_id=f"{r}-{c}", turn=c))
            prompt = prompt + generated + [7 + k for k in range(tool_tokens)]
            if c % 3 == 1:  # The template drops the first token call 0 generated (its reasoning, say).
                prompt = prompt[:tokens] + prompt[tokens + 1:]
        rollout_id = f"{name}-{r:05d}"
        with open(os.path.join(path, f"{rollout_id}.capture.jsonl"), "wb") as handle:
            handle.write(b"".join(lines) + (b'{"torn' if r % 5 == 4 else b""))
        if r % 5 == 4:
            open(os.path.join(path, f"{rollout_id}.capture.incomplete"), "wb").close()
            with open(os.path.join(path, f"{rollout_id}-a1.capture.jsonl"), "wb") as handle:
                handle.write(b"".join(lines))


#: What a sidecar keeps in its capture directory of its own, beside the rollouts' files: its calls
#: in flight (`proxy.app.features._in_flight`), and the time indexes of ends and starts (docs/reading.md).
SIDECAR_OWN = ("inflight", "start-index", "end-index")


def rollout_files(capture_dir: str) -> list[str]:
    """The names in a capture directory but the sidecar's own (`SIDECAR_OWN`)."""
    return sorted(name for name in os.listdir(capture_dir) if name not in SIDECAR_OWN)


def remove_live_capture_dir(path: str) -> None:
    """Remove a capture directory that running sidecars write into (each publishes its calls in
    flight there ten times a second: `proxy.app.features._in_flight`), as an operator's ``rm -rf`` would,
    retried until it is gone."""
    import shutil

    for _ in range(100):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return
    raise AssertionError(f"{path} could not be removed")
