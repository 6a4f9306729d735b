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
