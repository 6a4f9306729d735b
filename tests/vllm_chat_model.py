"""A model of vLLM 0.32's streamed chat replies, to derive the token capture mode's expected bytes
independently of the cutter (issue 30).

`chat_payloads` follows ``chat_completion_stream_generator`` (vllm/entrypoints/openai/
chat_completion/serving.py): one chunk per choice with the role first (``prompt_token_ids`` on it,
null unless asked), one per token after that -- except a token the parser holds back
(``delta_message is None``), which gets a chunk (``"delta":{}``) only when ``logprobs`` or
``return_token_ids`` is asked -- usage on every chunk under ``continuous_usage_stats``, a final
usage chunk under ``include_usage``, and ``[DONE]``. The same generation modelled twice, once for
the agent's own request and once for the mode's, gives what the agent must receive and what the
upstream sends the sidecar. `FRAMINGS` are the ways the SSE rules allow those payloads to be sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import orjson

#: A token the parser answers with ``DeltaMessage()`` itself (Mistral's, once its tool calls close).
EMPTY: dict[str, Any] = {}


@dataclass(frozen=True)
class Token:
    id: int
    text: str
    logprob: float
    #: What the parser makes of it: None (held back), `EMPTY`, or the delta it sends.
    delta: Any


def text_tokens(*texts: str, start_id: int = 100) -> list[Token]:
    return [Token(start_id + position, text, -0.25 - position / 8, {"content": text}) for position, text in enumerate(texts)]


def chat_payloads(choices: list[list[Token]], *, logprobs: bool, token_ids: bool, continuous_usage: bool = False,
                  include_usage: bool = False, prompt_ids: tuple[int, ...] = (1, 2, 3), finish: str = "stop") -> list[bytes]:
    """The data of each event vLLM writes for a chat request with these choices' generations."""
    head = {"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1796084163, "model": "m"}
    prompt = len(prompt_ids)
    events = []
    for index in range(len(choices)):
        chunk = {**head, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                      "finish_reason": None}]}
        if continuous_usage:
            chunk["usage"] = _usage(prompt, 0)
        chunk["prompt_token_ids"] = list(prompt_ids) if token_ids else None
        chunk["prompt_text"] = None
        events.append(orjson.dumps(chunk))
    counts = [0] * len(choices)
    for step in range(max(map(len, choices))):  # The engine steps every choice together.
        for index, tokens in enumerate(choices):
            if step >= len(tokens):
                continue
            token, last = tokens[step], step == len(tokens) - 1
            counts[index] += 1
            entry = {"content": [{"token": token.text, "logprob": token.logprob, "bytes": list(token.text.encode()),
                                  "top_logprobs": []}]} if logprobs else None
            delta = token.delta
            if delta is None:
                if not last and entry is None and not token_ids:
                    continue
                delta = {}
            choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": entry, "finish_reason": finish if last else None}
            if last:
                choice["stop_reason"] = None
            choice["token_ids"] = [token.id] if token_ids else None
            chunk = {**head, "choices": [choice]}
            if continuous_usage:
                chunk["usage"] = _usage(prompt, counts[index])
            events.append(orjson.dumps(chunk))
    if include_usage:
        events.append(orjson.dumps({**head, "choices": [], "usage": _usage(prompt * len(choices), sum(counts)),
                                    "system_fingerprint": "vllm-0.32.0"}))
    events.append(b"[DONE]")
    return events


def _usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "completion_tokens_details": None}


def mistral_tool_call_tokens() -> list[Token]:
    """Mistral's pre-v11 tool call as its parser streams it (vllm/parser/mistral.py): the marker and
    the JSON up to the name held back, the name and argument deltas, then ``DeltaMessage()`` from
    the token that closes the array on (``ALL_TOOLS_COMPLETE``), a trailing space and EOS included."""
    call = {"index": 0, "id": "Xk3bQ9mZ1", "type": "function", "function": {"name": "add"}}
    return [
        Token(1, "Sure", -0.1, {"content": "Sure"}),
        Token(9, "[TOOL_CALLS]", -0.01, None),
        Token(1501, '[{"', -0.02, None),
        Token(1502, 'name', -0.02, None),
        Token(1503, '":', -0.02, None),
        Token(1504, ' "add"', -0.03, {"tool_calls": [call]}),
        Token(1505, ', "arguments', -0.02, None),
        Token(1506, '": {"a', -0.05, {"tool_calls": [{"index": 0, "function": {"arguments": '{"a'}}]}),
        Token(1507, '": 3}', -0.05, {"tool_calls": [{"index": 0, "function": {"arguments": '": 3}'}}]}),
        Token(1508, "}]", -0.01, EMPTY),
        Token(1509, " ", -0.4, EMPTY),
        Token(2, "</s>", -0.01, EMPTY),
    ]


def _lines(value: bytes) -> list[bytes]:
    """A compact JSON object as several ``data:`` values, one per top-level member (joined by LF,
    the client reads the same JSON: a line end between members is whitespace)."""
    if not value.startswith(b"{"):
        return [value]
    members = orjson.loads(value)
    parts = [orjson.dumps(key) + b":" + orjson.dumps(member) for key, member in members.items()]
    return [b"{" + parts[0]] + parts[1:-1] + [parts[-1] + b"}"] if len(parts) > 1 else [value]


def _multiline(values: list[bytes]) -> bytes:
    return b"".join(b"data: " + b",\ndata: ".join(_lines(value)) + b"\n\n" for value in values)


def _unterminated(values: list[bytes]) -> bytes:
    """The stream cut after its last chunk's data line, before its blank line (no ``[DONE]``)."""
    body = b"".join(b"data: " + value + b"\n\n" for value in values[:-2])
    return body + b"data: " + values[-2] + b"\n"


#: Ways to send the same events, each as the SSE rules (WHATWG) read them.
FRAMINGS: dict[str, Callable[[list[bytes]], bytes]] = {
    "lf": lambda values: b"".join(b"data: " + v + b"\n\n" for v in values),
    "crlf": lambda values: b"".join(b"data: " + v + b"\r\n\r\n" for v in values),
    "cr": lambda values: b"".join(b"data: " + v + b"\r\r" for v in values),
    "lf-then-crlf": lambda values: b"".join(b"data: " + v + b"\n\r\n" for v in values),
    "crlf-then-cr": lambda values: b"".join(b"data: " + v + b"\r\n\r" for v in values),
    "no-space": lambda values: b"".join(b"data:" + v + b"\n\n" for v in values),
    "named": lambda values: b"".join(b"event: message\nid: 1\ndata: " + v + b"\n\n" for v in values),
    "comment-holding-data": lambda values: b"".join(b': data: {"logprobs":{"content":[]}}\ndata: ' + v + b"\n\n"
                                                    for v in values),
    "bom": lambda values: b"\xef\xbb\xbf" + b"".join(b"data: " + v + b"\n\n" for v in values),
    "multi-line-data": _multiline,
    "unterminated-last": _unterminated,
}


def _escaped_key(key: str) -> bytes:
    """A key with its first character as a ``\\u`` escape: the same string to any JSON reader."""
    return b'"\\u%04x' % ord(key[0]) + orjson.dumps(key[1:])[1:] if key else b'""'


def _escaped_keys(value: Any) -> bytes:
    if isinstance(value, dict):
        return b"{" + b",".join(_escaped_key(key) + b":" + _escaped_keys(item) for key, item in value.items()) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(_escaped_keys(item) for item in value) + b"]"
    return orjson.dumps(value)


#: Ways to write the same JSON value that are not vLLM's compact bytes (a server, or a gateway that
#: re-serialises): each reads back as the same value. Applied to every payload (`spelt`).
SPELLINGS: dict[str, Callable[[Any], bytes]] = {
    "compact": orjson.dumps,
    "space-before-colon": lambda value: json.dumps(value, separators=(",", " :"), ensure_ascii=False).encode(),
    "spaced": lambda value: json.dumps(value, separators=(", ", " : "), ensure_ascii=False).encode(),
    "python-json": lambda value: json.dumps(value).encode(),
    "escaped-keys": _escaped_keys,
}


def spelt(payloads: list[bytes], spelling: str) -> list[bytes]:
    """Each JSON payload written as ``spelling`` says (``[DONE]`` as it is)."""
    return [payload if not payload.startswith(b"{") else SPELLINGS[spelling](orjson.loads(payload)) for payload in payloads]


def responses_payloads(deltas: list[str], *, logprobs: bool) -> list[tuple[str, bytes]]:
    """(event name, data) of a vLLM 0.32 Responses stream (responses/serving.py + streaming_events.py):
    text deltas with their logprobs (``[]`` unless ``include`` asks), the done events, the part's
    logprobs (null unless asked), and the response object's ``top_logprobs`` (null unless asked)."""
    def response(status: str, output: list) -> dict[str, Any]:
        return {"id": "resp_1", "object": "response", "created_at": 1, "status": status, "model": "m",
                "output": output, "top_logprobs": 0 if logprobs else None, "input_messages": None,
                "output_messages": None}

    def entries(text: str, position: int) -> list[dict[str, Any]]:
        return [{"token": text, "logprob": -0.5 - position, "bytes": list(text.encode()), "top_logprobs": []}] if logprobs else []

    text = "".join(deltas)
    everything = [entry for position, delta in enumerate(deltas) for entry in entries(delta, position)]
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": everything if logprobs else None}
    item = {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant", "content": [part]}
    events = [("response.created", {"type": "response.created", "sequence_number": 0, "response": response("in_progress", [])})]
    for position, delta in enumerate(deltas):
        events.append(("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": position + 1,
                                                      "item_id": "msg_1", "output_index": 0, "content_index": 0,
                                                      "delta": delta, "logprobs": entries(delta, position)}))
    number = len(deltas) + 1
    events += [
        ("response.output_text.done", {"type": "response.output_text.done", "sequence_number": number, "item_id": "msg_1",
                                       "output_index": 0, "content_index": 0, "text": text, "logprobs": everything}),
        ("response.content_part.done", {"type": "response.content_part.done", "sequence_number": number + 1,
                                        "item_id": "msg_1", "output_index": 0, "content_index": 0, "part": part}),
        ("response.output_item.done", {"type": "response.output_item.done", "sequence_number": number + 2,
                                       "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed", "sequence_number": number + 3,
                                "response": response("completed", [item])}),
    ]
    return [(name, orjson.dumps(payload)) for name, payload in events]


def named_events(events: list[tuple[str, bytes]], line_end: bytes = b"\n") -> bytes:
    """``event:`` + ``data:`` blocks, every line ending in ``line_end``."""
    return b"".join(b"event: " + name.encode() + line_end + b"data: " + data + line_end + line_end for name, data in events)


class TinyChatModel:
    """A vLLM-shaped chat server's arithmetic, for lineage tests: a message renders as its role's
    id, 100 + each character, then 0; the prompt ends with the assistant role (3); the reply to a
    conversation is scripted by the number of its user turns, its ids 100 + each character then 0.
    A sent-back assistant turn renders as exactly its generated ids, so a faithful conversation's
    prompts extend each other; ``drop_assistant_turns`` renders them as nothing (a template that
    drops what the model wrote: every later prompt drifts)."""

    ROLES = {"system": 1, "user": 2, "assistant": 3, "tool": 4}

    def __init__(self, replies: dict[int, str] | None = None, drop_assistant_turns: bool = False) -> None:
        self.replies = replies or {}
        self.drop_assistant_turns = drop_assistant_turns

    def render(self, messages: list[dict[str, Any]]) -> list[int]:
        ids: list[int] = []
        for message in messages:
            if message.get("role") == "assistant" and self.drop_assistant_turns:
                continue
            ids += [self.ROLES.get(message.get("role"), 5), *(100 + ord(c) for c in str(message.get("content") or "")), 0]
        return [*ids, 3]

    def reply_text(self, messages: list[dict[str, Any]]) -> str:
        turn = sum(1 for message in messages if message.get("role") == "user")
        return self.replies.get(turn, f"reply {turn}")

    def body(self, request: dict[str, Any], call: int = 0) -> bytes:
        """The non-streamed reply vLLM writes for ``request`` (token fields where it asks)."""
        text = self.reply_text(request["messages"])
        prompt = self.render(request["messages"])
        generated = [*(100 + ord(c) for c in text), 0]
        logprobs = {"content": [{"token": c, "logprob": -0.125 * (i + 1), "bytes": list(c.encode()), "top_logprobs": []}
                                for i, c in enumerate([*text, "</s>"])]} if request.get("logprobs") else None
        return orjson.dumps({
            "id": f"chatcmpl-{call}", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                         "finish_reason": "stop", "stop_reason": None,
                         "token_ids": generated if request.get("return_token_ids") else None}],
            "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(generated),
                      "completion_tokens": len(generated)},
            "prompt_token_ids": prompt if request.get("return_token_ids") else None})
