"""Transcripts written for this project, shaped like the real recordings of each dialect.

The real recordings live in ../shared/fixtures and are used only by the conformance suite.
"""

from __future__ import annotations

import orjson


def _event(name: str | None, payload: object) -> bytes:
    data = payload if isinstance(payload, str) else orjson.dumps(payload).decode()
    return (f"event: {name}\n" if name else "").encode() + f"data: {data}\n\n".encode()


CHAT_REQUEST = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                             "stream_options": {"include_usage": True}})
CHAT_JSON_REQUEST = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})

_CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}
CHAT_STREAM = b"".join([
    b": keep-alive\n\n",
    _event(None, {**_CHUNK, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}),
    _event(None, {**_CHUNK, "choices": [{"index": 0, "delta": {"reasoning_content": "Think \u00e9\u00e8 "}, "finish_reason": None}]}),
    _event(None, {**_CHUNK, "choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": None}]}),
    _event(None, {**_CHUNK, "choices": [{"index": 0, "delta": {"content": "lo \u2603"}, "finish_reason": None}]}),
    _event(None, {**_CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    _event(None, {**_CHUNK, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12,
                                                      "prompt_tokens_details": {"cached_tokens": 4}}}),
    _event(None, "[DONE]"),
])
CHAT_TERMINAL = _event(None, "[DONE]")

CHAT_JSON = orjson.dumps({
    "id": "chatcmpl-2", "object": "chat.completion", "created": 1700000000, "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
})

RESPONSES_REQUEST = orjson.dumps({"model": "m", "input": "hi", "stream": True})
_RESPONSE = {"id": "resp_1", "object": "response", "created_at": 1700000000, "model": "m", "output": [], "usage": None}
_DONE_RESPONSE = {**_RESPONSE, "status": "completed", "output": [
    {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
     "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}],
    "usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 1, "total_tokens": 6}}
RESPONSES_STREAM = b"".join([
    _event("response.created", {"type": "response.created", "sequence_number": 0, "response": {**_RESPONSE, "status": "in_progress"}}),
    _event("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
                                          "item": {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}}),
    _event("response.content_part.added", {"type": "response.content_part.added", "sequence_number": 2, "output_index": 0,
                                           "item_id": "msg_1", "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
    _event("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 3, "output_index": 0,
                                          "item_id": "msg_1", "content_index": 0, "delta": "Hel"}),
    _event("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 4, "output_index": 0,
                                          "item_id": "msg_1", "content_index": 0, "delta": "lo"}),
    _event("response.completed", {"type": "response.completed", "sequence_number": 5, "response": _DONE_RESPONSE}),
])

MESSAGES_REQUEST = orjson.dumps({"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], "stream": True})
MESSAGES_STREAM = b"".join([
    _event("message_start", {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                                                                  "content": [], "stop_reason": None, "stop_sequence": None,
                                                                  "usage": {"input_tokens": 7, "cache_read_input_tokens": 3,
                                                                            "cache_creation_input_tokens": 0, "output_tokens": 1}}}),
    _event("ping", {"type": "ping"}),
    _event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    _event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}),
    _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
    _event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                             "usage": {"output_tokens": 2}}),
    _event("message_stop", {"type": "message_stop"}),
])

CONTEXT_LENGTH_ERROR = orjson.dumps({"error": {
    "message": "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
               "(4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
    "type": "BadRequestError", "param": None, "code": 400}})
SERVER_ERROR = orjson.dumps({"error": {"message": "CUDA out of memory", "type": "InternalServerError", "param": None, "code": 500}})


# -- Shapes the recordings lack (issue 3) --------------------------------------------------------

def chat_chunk(choices: list[dict], usage: dict | None = None, **extra: object) -> bytes:
    payload = {**_CHUNK, "choices": choices, **extra}
    if usage is not None:
        payload["usage"] = usage
    return _event(None, payload)


# vLLM's chat stream: `delta.reasoning` (newer releases), vLLM-only fields, usage on every chunk
# (--enable-force-include-usage), keep-alive comments.
def _VLLM_USAGE(completion: int) -> dict:
    return {"prompt_tokens": 20, "completion_tokens": completion, "total_tokens": 20 + completion,
            "prompt_tokens_details": {"cached_tokens": 16}}

VLLM_CHAT_REASONING_USAGE_EVERY_CHUNK = b"".join([
    b": ping - 2026-01-01 00:00:00\n\n",
    chat_chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}], _VLLM_USAGE(0),
               prompt_token_ids=None),
    chat_chunk([{"index": 0, "delta": {"reasoning": "Let me "}, "logprobs": None, "finish_reason": None, "token_ids": [1]}], _VLLM_USAGE(1)),
    chat_chunk([{"index": 0, "delta": {"reasoning": "think."}, "logprobs": None, "finish_reason": None, "token_ids": [2]}], _VLLM_USAGE(2)),
    b": keep-alive\n\n",
    chat_chunk([{"index": 0, "delta": {"content": "42"}, "logprobs": None, "finish_reason": None, "token_ids": [3]}], _VLLM_USAGE(3)),
    chat_chunk([{"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": "stop", "stop_reason": None}], _VLLM_USAGE(3)),
    _event(None, "[DONE]"),
])

# n = 2 with interleaved choices, one of them calling two tools in parallel; CRLF line ends.
CHAT_N2_PARALLEL_TOOLS_CRLF = b"".join([
    chat_chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None},
                {"index": 1, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]),
    chat_chunk([{"index": 1, "delta": {"content": "Choice one."}, "finish_reason": None}]),
    chat_chunk([{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                                       "function": {"name": "get_weather", "arguments": ""}}]}, "finish_reason": None}]),
    chat_chunk([{"index": 0, "delta": {"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                                       "function": {"name": "get_time", "arguments": "{\"tz\": "}}]}, "finish_reason": None}]),
    chat_chunk([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": \"Oslo\"}"}}]}, "finish_reason": None}]),
    chat_chunk([{"index": 0, "delta": {"tool_calls": [{"index": 1, "function": {"arguments": "\"CET\"}"}}]}, "finish_reason": None}]),
    chat_chunk([{"index": 1, "delta": {}, "finish_reason": "stop"}]),
    chat_chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
    chat_chunk([], {"prompt_tokens": 30, "completion_tokens": 25, "total_tokens": 55}),
    _event(None, "[DONE]"),
]).replace(b"\n", b"\r\n")

# A chat stream cut inside a tool call's arguments (the upstream died mid-generation).
CHAT_CUT_IN_TOOL_ARGUMENTS = b"".join([
    chat_chunk([{"index": 0, "delta": {"role": "assistant", "content": None,
                                       "tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                                                       "function": {"name": "search", "arguments": ""}}]}, "finish_reason": None}]),
    chat_chunk([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"query\": \"long"}}]}, "finish_reason": None}]),
])

# An unterminated last event: the stream ends inside `data: [DONE]` (no blank line after it).
CHAT_UNTERMINATED_LAST_EVENT = CHAT_STREAM[: -len(b"\n")]

# vLLM's Responses API stream: reasoning as `reasoning_text` content, then a message.
_VLLM_RESPONSE = {"id": "resp_vllm", "object": "response", "created_at": 1767225600, "model": "Qwen/Qwen3-8B",
                  "status": "in_progress", "output": [], "usage": None, "tools": [], "parallel_tool_calls": True,
                  "tool_choice": "auto"}
_VLLM_REASONING = {"id": "rs_1", "type": "reasoning", "summary": [],
                   "content": [{"type": "reasoning_text", "text": "User greets; reply."}], "status": "completed"}
_VLLM_MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": "Hi!", "annotations": [], "logprobs": []}]}


def _r(kind: str, number: int, **fields: object) -> bytes:
    return _event(kind, {"type": kind, "sequence_number": number, **fields})


VLLM_RESPONSES_STREAM = b"".join([
    _r("response.created", 0, response=_VLLM_RESPONSE),
    _r("response.in_progress", 1, response=_VLLM_RESPONSE),
    _r("response.output_item.added", 2, output_index=0, item={**_VLLM_REASONING, "content": [], "status": "in_progress"}),
    _r("response.reasoning_part.added", 3, output_index=0, item_id="rs_1", content_index=0, part={"type": "reasoning_text", "text": ""}),
    _r("response.reasoning_text.delta", 4, output_index=0, item_id="rs_1", content_index=0, delta="User greets; "),
    _r("response.reasoning_text.delta", 5, output_index=0, item_id="rs_1", content_index=0, delta="reply."),
    _r("response.reasoning_text.done", 6, output_index=0, item_id="rs_1", content_index=0, text="User greets; reply."),
    _r("response.output_item.done", 7, output_index=0, item=_VLLM_REASONING),
    _r("response.output_item.added", 8, output_index=1, item={**_VLLM_MESSAGE, "content": [], "status": "in_progress"}),
    _r("response.content_part.added", 9, output_index=1, item_id="msg_1", content_index=0,
       part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}),
    _r("response.output_text.delta", 10, output_index=1, item_id="msg_1", content_index=0, delta="Hi!", logprobs=[]),
    _r("response.output_text.done", 11, output_index=1, item_id="msg_1", content_index=0, text="Hi!", logprobs=[]),
    _r("response.content_part.done", 12, output_index=1, item_id="msg_1", content_index=0, part=_VLLM_MESSAGE["content"][0]),
    _r("response.output_item.done", 13, output_index=1, item=_VLLM_MESSAGE),
    _r("response.completed", 14, response={**_VLLM_RESPONSE, "status": "completed", "output": [_VLLM_REASONING, _VLLM_MESSAGE],
                                           "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
                                                     "output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 0},
                                                     "total_tokens": 21}}),
])

# A Responses stream cut inside a function call's arguments: the partial response is rebuilt.
RESPONSES_CUT_IN_FUNCTION_ARGUMENTS = b"".join([
    _r("response.created", 0, response=_VLLM_RESPONSE),
    _r("response.output_item.added", 1, output_index=0,
       item={"id": "fc_1", "type": "function_call", "status": "in_progress", "call_id": "call_1", "name": "search", "arguments": ""}),
    _r("response.function_call_arguments.delta", 2, output_index=0, item_id="fc_1", delta="{\"query\": "),
    _r("response.function_call_arguments.delta", 3, output_index=0, item_id="fc_1", delta="\"weath"),
])

# Anthropic's mid-stream failure: `event: error` with an overloaded_error after some text.
MESSAGES_OVERLOADED_MID_STREAM = MESSAGES_STREAM.split(b"event: content_block_stop")[0] + _event(
    "error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})


# -- RL traffic: vLLM's logprobs and token ids (issue 13) ---------------------------------------
# Shapes as vLLM writes them (vllm/entrypoints/openai/chat_completion/serving.py, main at
# 006c49d4): the first chunk of each choice is the role delta and carries the top-level
# `prompt_token_ids`; every later chunk carries that step's `token_ids` and `logprobs.content`;
# the finishing chunk carries `finish_reason` and `stop_reason`; `model_dump_json(exclude_unset)`
# keeps explicit nulls.

RL_PROMPT_IDS = [151644, 872, 198, 13048, 151645]


def rl_token(choice: int, step: int) -> tuple[int, str, float]:
    """The (token id, text, logprob) the transcript's choice ``choice`` emits at ``step``."""
    token_id = 1000 + 100 * choice + step
    return token_id, f"w{choice}.{step} ", -round(0.01 * (step + 1) + 0.5 * choice, 4)


def vllm_rl_chat_stream(tokens: int = 6, n: int = 1, top_logprobs: int = 2, as_token_ids: bool = False,
                        cut_after: int | None = None, error_with_usage: bool = False,
                        include_usage: bool = True) -> bytes:
    """A vLLM chat stream with `logprobs`, `top_logprobs` and `return_token_ids`, choices interleaved."""
    chunk = {"id": "chatcmpl-rl", "object": "chat.completion.chunk", "created": 1767225600, "model": "Qwen/Qwen3-8B"}
    events = [_event(None, {**chunk, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                  "logprobs": None, "finish_reason": None}],
                            "prompt_token_ids": RL_PROMPT_IDS}) for i in range(n)]

    def entry(token_id: int, text: str, logprob: float) -> dict:
        token = f"token_id:{token_id}" if as_token_ids else text
        return {"token": token, "logprob": logprob, "bytes": list(text.encode()),
                "top_logprobs": [{"token": token, "logprob": logprob, "bytes": list(text.encode())}]
                + [{"token": f"token_id:{token_id + k}" if as_token_ids else f"alt{k}", "logprob": logprob - k,
                    "bytes": None} for k in range(1, top_logprobs)]}

    for step in range(tokens):
        for i in range(n):
            if cut_after is not None and step * n + i >= cut_after:
                return b"".join(events)
            token_id, text, logprob = rl_token(i, step)
            last = step == tokens - 1
            events.append(_event(None, {**chunk, "choices": [{
                "index": i, "delta": {"content": text}, "logprobs": {"content": [entry(token_id, text, logprob)]},
                "finish_reason": ("length" if error_with_usage else "stop") if last else None,
                **({"stop_reason": None} if last else {}), "token_ids": [token_id]}]}))
    usage = {"prompt_tokens": len(RL_PROMPT_IDS), "completion_tokens": tokens * n,
             "total_tokens": len(RL_PROMPT_IDS) + tokens * n}
    if error_with_usage:  # OpenRouter after finish_reason: length
        events.append(_event(None, {**chunk, "error": {"code": 400, "message": "Token limit reached"},
                                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                 "finish_reason": None, "logprobs": None}], "usage": usage}))
    elif include_usage:
        events.append(_event(None, {**chunk, "choices": [], "usage": usage}))
    events.append(_event(None, "[DONE]"))
    return b"".join(events)


def vllm_rl_chat_json(tokens: int = 6, n: int = 1) -> bytes:
    """The non-streaming reply for the same generation: arrays whole, as vLLM returns them."""
    choices = []
    for i in range(n):
        steps = [rl_token(i, step) for step in range(tokens)]
        choices.append({"index": i, "message": {"role": "assistant", "content": "".join(text for _, text, _ in steps)},
                        "logprobs": {"content": [{"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []}
                                                 for _, text, lp in steps]},
                        "finish_reason": "stop", "stop_reason": None, "token_ids": [tid for tid, _, _ in steps]})
    return orjson.dumps({"id": "chatcmpl-rl", "object": "chat.completion", "created": 1767225600, "model": "Qwen/Qwen3-8B",
                         "choices": choices, "usage": {"prompt_tokens": 5, "completion_tokens": tokens * n,
                                                       "total_tokens": 5 + tokens * n},
                         "prompt_logprobs": None, "prompt_token_ids": RL_PROMPT_IDS, "kv_transfer_params": None})


# NeMo RL's vLLM worker puts the arrays on the message itself.
NEMO_RL_CHAT_JSON = orjson.dumps({
    "id": "chatcmpl-nemo", "object": "chat.completion", "created": 1767225600, "model": "policy",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": "ok", "prompt_token_ids": [1, 2, 3],
        "generation_token_ids": [7, 8], "generation_log_probs": [-0.25, -0.5]}}],
})

# Responses with output_text logprobs on each delta and none on the terminal's part.
RESPONSES_LOGPROBS_ON_DELTAS_ONLY = b"".join([
    _event("response.created", {"type": "response.created", "sequence_number": 0, "response": {**_RESPONSE, "status": "in_progress"}}),
    _event("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
                                          "item": {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}}),
    _event("response.content_part.added", {"type": "response.content_part.added", "sequence_number": 2, "output_index": 0,
                                           "item_id": "msg_1", "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
    _event("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 3, "output_index": 0, "item_id": "msg_1",
                                          "content_index": 0, "delta": "Hel", "logprobs": [{"token": "Hel", "logprob": -0.1, "top_logprobs": []}]}),
    _event("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 4, "output_index": 0, "item_id": "msg_1",
                                          "content_index": 0, "delta": "lo", "logprobs": [{"token": "lo", "logprob": -0.2, "top_logprobs": []}]}),
    _event("response.completed", {"type": "response.completed", "sequence_number": 5, "response": _DONE_RESPONSE}),
])
