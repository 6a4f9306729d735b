"""Deterministic replies of the stand-in model server, in the four dialects, whole or streamed.

Each dialect has a ``*_reply`` that builds the object the non-streaming endpoint returns and a
``*_events`` that yields the SSE events a real server would send for the same reply. The reply
is a pure function of the request: a tool call when tools are offered and no tool result came
back yet, otherwise text; always a little reasoning, and usage with cached tokens.

Chat also speaks what RL harnesses ask vLLM for (`TokenOptions`): ``logprobs`` / ``top_logprobs``,
``return_token_ids`` and ``return_tokens_as_token_ids``, with the field placement of vLLM's
``ChatCompletionResponse`` / ``ChatCompletionStreamResponse`` (vllm/entrypoints/openai/
chat_completion/protocol.py and serving.py, vLLM main at d5dba2d7 / 006c49d4): whole replies carry
top-level ``prompt_token_ids`` and per-choice ``token_ids`` and ``logprobs.content``; streams carry
``prompt_token_ids`` on the first (role) chunk and each later chunk's ``token_ids`` and
``logprobs.content`` for the tokens it adds. Each word piece is one token.
"""

from __future__ import annotations

import base64
import re
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import orjson

STAND_IN_MODEL = "stand-in-1"
_WORDS = re.compile(r"\S+\s*|\s+")


@dataclass(frozen=True)
class Plan:
    """What the stand-in model says: reasoning, then text or one tool call."""

    reasoning: str
    text: str | None
    tool_name: str | None
    tool_arguments: str
    call_id: str
    prompt_tokens: int
    cached_tokens: int
    #: The prompt's ids when the stand-in renders it (chat: `chat_prompt_ids`), else made up.
    prompt_ids: tuple[int, ...] | None = None

    @property
    def output_tokens(self) -> int:
        said = self.text if self.text is not None else self.tool_arguments
        return len(_pieces(self.reasoning)) + len(_pieces(said))

    @property
    def reasoning_tokens(self) -> int:
        return len(_pieces(self.reasoning))


@dataclass(frozen=True)
class TokenOptions:
    """The vLLM request fields that put token ids and logprobs in a chat reply."""

    logprobs: bool = False
    top_logprobs: int = 0
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    #: vLLM 0.33's ``return_weight_versions`` (chat; `chat_reply`, `chat_events`).
    return_weight_versions: bool = False

    @classmethod
    def from_request(cls, body: dict[str, Any]) -> "TokenOptions":
        top = body.get("top_logprobs")
        return cls(bool(body.get("logprobs")), top if isinstance(top, int) and 0 <= top <= 20 else 0,
                   bool(body.get("return_token_ids")), bool(body.get("return_tokens_as_token_ids")),
                   bool(body.get("return_weight_versions")))

    @classmethod
    def from_completions_request(cls, body: dict[str, Any]) -> "TokenOptions":
        """Completions: ``logprobs`` is the number of alternatives (0: the sampled token's only)."""
        logprobs = body.get("logprobs")
        asked = isinstance(logprobs, int) and not isinstance(logprobs, bool) and 0 <= logprobs <= 20
        return cls(asked, max(1, logprobs) if isinstance(logprobs, int) and asked else 0, bool(body.get("return_token_ids")),
                   bool(body.get("return_tokens_as_token_ids")))


@dataclass(frozen=True)
class ResponsesTokenOptions:
    """vLLM's Responses fields: output_text logprobs via ``include``, token ids via ``enable_response_messages``."""

    logprobs: bool = False
    top_logprobs: int = 0
    messages: bool = False

    @classmethod
    def from_request(cls, body: dict[str, Any]) -> "ResponsesTokenOptions":
        include = body.get("include")
        top = body.get("top_logprobs")
        return cls(isinstance(include, list) and "message.output_text.logprobs" in include,
                   top if isinstance(top, int) and 0 <= top <= 20 else 0, body.get("enable_response_messages") is True)


def token_id_of(piece: str) -> int:
    """The stand-in tokenizer: a word piece's id (stable, in a 150k vocabulary)."""
    return 100 + zlib.crc32(piece.encode()) % 150_000


def logprob_of(piece: str) -> float:
    return -((zlib.crc32(piece.encode()) >> 8) % 5000) / 1000


def text_token_ids(text: str) -> list[int]:
    """A text's ids under the stand-in tokenizer (word pieces)."""
    return [token_id_of(piece) for piece in _pieces(text)] if text else []


def prompt_token_ids(plan: "Plan", serial: int) -> list[int]:
    if plan.prompt_ids is not None:
        return list(plan.prompt_ids)
    return [100 + (serial * 7 + i * 31) % 150_000 for i in range(plan.prompt_tokens)]


@dataclass(frozen=True)
class ExpertRouting:
    """A MoE model's shape, for the stand-in's ``routed_experts`` (vLLM with
    ``--enable-return-routed-experts``: ``model_executor/layers/fused_moe/routed_experts_capturer.py``)."""

    layers: int
    top_k: int
    experts: int

    @property
    def dtype(self) -> str:
        return "|u1" if self.experts <= 256 else "<u2"  # The capturer's narrowest dtype.

    def encoded(self, sequence: list[int], start: int) -> str:
        """vLLM's ``numpy2base64`` of the routing of ``sequence[start:-1]`` (the last token is never
        read back), ``(tokens - 1 - start, layers, top_k)``. A token's experts depend on it, its
        position and the layer, so a prefix is routed alike in every call that reads it."""
        rows = []
        for position in range(start, len(sequence) - 1):
            token = sequence[position]
            for layer in range(self.layers):
                first = (token * 31 + layer * 7 + position) % self.experts
                rows += [(first + k) % self.experts for k in range(self.top_k)]
        code = "B" if self.dtype == "|u1" else "H"
        shape = (max(0, len(sequence) - 1 - start), self.layers, self.top_k)
        header = f"{{'descr': '{self.dtype}', 'fortran_order': False, 'shape': {shape}, }}"
        header += " " * ((64 - (len(header) + 11) % 64) % 64) + "\n"
        blob = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + struct.pack(f"<{len(rows)}{code}", *rows)
        return base64.b64encode(blob).decode("ascii")


def _logprob_entry(piece: str, options: TokenOptions) -> dict[str, Any]:
    def token(text: str) -> str:
        return f"token_id:{token_id_of(text)}" if options.return_tokens_as_token_ids else text

    logprob = logprob_of(piece)
    alternatives = [{"token": token(piece), "logprob": logprob, "bytes": list(piece.encode())}]
    alternatives += [{"token": token(f"{piece}~{k}"), "logprob": round(logprob - k, 3), "bytes": list(f"{piece}~{k}".encode())}
                     for k in range(1, options.top_logprobs)]
    return {"token": token(piece), "logprob": logprob, "bytes": list(piece.encode()),
            "top_logprobs": alternatives[: options.top_logprobs]}


def make_plan(request_bytes: int, user_text: str, tool_name: str | None, has_tool_result: bool, serial: int,
              prompt_ids: list[int] | None = None) -> Plan:
    # A 64-token chat template precedes every prompt; its first three 16-token blocks are always
    # in the prefix cache, so every reply reports cached tokens the way vLLM does.
    prompt_tokens = len(prompt_ids) if prompt_ids is not None else 64 + request_bytes // 4
    cached = 48
    ids = tuple(prompt_ids) if prompt_ids is not None else None
    if tool_name and not has_tool_result:
        return Plan(TOOL_REASONING, None, tool_name,
                    '{"city": "Paris", "unit": "celsius"}', f"call_standin_{serial}", prompt_tokens, cached, ids)
    if has_tool_result:
        text = "It is sunny and 22 degrees Celsius in Paris."
    else:
        text = f"Hello from the stand-in model. You said: {user_text[:80]}"
    return Plan(ANSWER_REASONING, text, None, "", f"call_standin_{serial}", prompt_tokens, cached, ids)


#: The reasoning that begins every stand-in reply: before a tool call, and before an answer.
TOOL_REASONING = "The user wants the weather, so I will call the tool."
ANSWER_REASONING = "A short answer is enough here."
#: Chat templates: ``chain`` renders a sent-back assistant turn as exactly the ids generated for it
#: (its reasoning, then its text or tool arguments), so each turn's prompt extends the last turn's
#: prompt + generation; ``drop-reasoning`` leaves the reasoning out, as Qwen3's template does, so
#: every later turn drifts where the earlier reasoning was.
TEMPLATES = ("chain", "drop-reasoning")


#: The stand-in chat template's markers (ChatML-like): a message is START, role, text, END.
_START, _END = 1, 2
_ROLES = {"system": 3, "developer": 3, "user": 4, "assistant": 5, "tool": 6}
#: The fixed 64-token system preamble every rendered prompt begins with.
_PREAMBLE = [10 + i for i in range(64)]


def chat_prompt_ids(messages: list[Any], text_of: Any, template: str = "chain", continue_final: bool = False) -> list[int]:
    """The prompt as the stand-in's chat template renders it, like vLLM's: every message's role and
    text (an assistant's tool calls as their arguments), then the generation prompt.

    A sent-back assistant turn's reasoning: a message that carries it (``reasoning``, as vLLM
    builds a Responses reasoning item into a message) gets exactly that; a chat message, which
    never carries it, gets the reasoning its reply began with. Both under the ``chain`` template
    only (``drop-reasoning`` leaves it out, `TEMPLATES`). Under ``chain`` an assistant message right
    after another continues its turn (vLLM gives a Responses reasoning item a message of its own,
    before the text or the call it preceded), so a turn sent back as generated renders as the ids
    generated for it. ``continue_final`` (vLLM's ``continue_final_message``, resuming an aborted
    reply): the last assistant message is left open, with no generation prompt after it."""
    ids = list(_PREAMBLE)
    previous_role = None
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "assistant" and previous_role == "assistant" and template == "chain":
            ids.pop()  # The turn goes on: its END comes after this message.
        else:
            ids += [_START, _ROLES.get(str(role), 7)]
        if role == "assistant" and template == "chain":
            if "reasoning" in message:
                ids += text_token_ids(str(message.get("reasoning") or ""))
            else:
                ids += text_token_ids(TOOL_REASONING if message.get("tool_calls") else ANSWER_REASONING)
        ids += text_token_ids(text_of(message.get("content")))
        for call in message.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("function"), dict):
                ids += text_token_ids(str(call["function"].get("arguments") or ""))
        ids.append(_END)
        previous_role = role
    if continue_final and previous_role == "assistant":
        return ids[:-1]
    return ids + [_START, _ROLES["assistant"]]


def responses_messages(body: dict[str, Any], earlier: list[dict[str, Any]] | None,
                       earlier_output: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """A Responses request as the chat messages vLLM builds from it (its ``responses_utils``): the
    instructions as a system message; with ``previous_response_id``, that request's messages and
    the text of its output messages (its reasoning and calls left out, as vLLM leaves them); then
    each input item: a message as itself, a ``function_call`` as an assistant message with that
    tool call, its output as a tool message, a ``reasoning`` item as an assistant message holding
    its text (its content's, else its summary's). Every assistant message says whether it carries
    reasoning (``reasoning``: None when not), as vLLM's do."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    messages += earlier or []
    for item in earlier_output or ():
        if isinstance(item, dict) and item.get("type") == "message":
            for part in item.get("content") or ():
                messages.append({"role": "assistant", "content": part.get("text", "") if isinstance(part, dict) else "",
                                 "reasoning": None})
    items = body.get("input")
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else (items or []):
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "function_call":
            messages.append({"role": "assistant", "reasoning": None, "tool_calls": [
                {"type": "function", "id": item.get("call_id"),
                 "function": {"name": item.get("name"), "arguments": item.get("arguments") or ""}}]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            text = parts[0].get("text", "") if parts and isinstance(parts[0], dict) else ""
            messages.append({"role": "assistant", "reasoning": text})
        elif item.get("role") == "assistant":
            messages.append({"role": "assistant", "content": item.get("content"), "reasoning": None})
        elif item.get("role") is not None:
            messages.append({"role": item["role"], "content": item.get("content")})
    return messages


def _pieces(text: str) -> list[str]:
    return _WORDS.findall(text) or ([text] if text else [])


def text_pieces(text: str) -> list[str]:
    """The stand-in tokenizer's pieces of ``text`` (the tokens a reply is streamed in)."""
    return _pieces(text) if text else []


def sse(event: str | None, payload: Any) -> bytes:
    data = payload if isinstance(payload, str) else orjson.dumps(payload).decode()
    return (f"event: {event}\n" if event else "").encode() + f"data: {data}\n\n".encode()


# -- Responses ---------------------------------------------------------------------------------

def responses_reply(plan: Plan, serial: int, created: int,
                    tokens: ResponsesTokenOptions = ResponsesTokenOptions()) -> dict[str, Any]:
    """As vLLM writes it: ``top_logprobs``, the parts' ``logprobs`` and ``input_messages`` /
    ``output_messages`` always present, null unless asked (vllm/entrypoints/openai/responses)."""
    output: list[dict[str, Any]] = [
        {"id": f"rs_{serial}", "type": "reasoning", "summary": [{"type": "summary_text", "text": plan.reasoning}]}
    ]
    if plan.text is not None:
        # As vLLM: the text part carries the logprobs of every generated token, reasoning included.
        logprobs = [_responses_logprob(piece, tokens) for piece in generated_pieces(plan)] if tokens.logprobs else None
        output.append({"id": f"msg_{serial}", "type": "message", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": plan.text, "annotations": [], "logprobs": logprobs}]})
    else:
        output.append({"id": f"fc_{serial}", "type": "function_call", "status": "completed", "call_id": plan.call_id,
                       "name": plan.tool_name, "arguments": plan.tool_arguments})
    return {
        "id": f"resp_standin_{serial}", "object": "response", "created_at": created, "status": "completed",
        "model": STAND_IN_MODEL, "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
        "tools": [], "error": None, "incomplete_details": None, "instructions": None, "metadata": {},
        "temperature": 1.0, "top_logprobs": tokens.top_logprobs if tokens.logprobs else None, "top_p": 1.0,
        "usage": {"input_tokens": plan.prompt_tokens, "input_tokens_details": {"cached_tokens": plan.cached_tokens},
                  "output_tokens": plan.output_tokens,
                  "output_tokens_details": {"reasoning_tokens": plan.reasoning_tokens},
                  "total_tokens": plan.prompt_tokens + plan.output_tokens},
        "input_messages": [{"message": "", "tokens": prompt_token_ids(plan, serial), "type": "raw_message_tokens"}]
        if tokens.messages else None,
        "output_messages": [{"message": "", "tokens": [token_id_of(p) for p in generated_pieces(plan)],
                             "type": "raw_message_tokens"}] if tokens.messages else None,
    }


def _responses_logprob(piece: str, tokens: ResponsesTokenOptions) -> dict[str, Any]:
    logprob = logprob_of(piece)
    return {"token": piece, "logprob": logprob, "bytes": list(piece.encode()),
            "top_logprobs": [{"token": f"{piece}~{k}", "logprob": round(logprob - k, 3), "bytes": list(f"{piece}~{k}".encode())}
                             for k in range(1, tokens.top_logprobs + 1)]}


def responses_events(reply: dict[str, Any]) -> Iterator[bytes]:
    sequence = iter(range(1_000_000))

    def event(kind: str, **fields: Any) -> bytes:
        return sse(kind, {"type": kind, "sequence_number": next(sequence), **fields})

    # As vLLM: the token messages only on the terminal response.
    started = {**reply, "status": "in_progress", "output": [], "usage": None, "input_messages": None,
               "output_messages": None}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(reply["output"]):
        yield from _responses_item_events(event, index, item)
    yield event("response.completed", response=reply)


def _responses_item_events(event: Any, index: int, item: dict[str, Any]) -> Iterator[bytes]:
    base = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "reasoning":
        yield event("response.output_item.added", output_index=index, item={**item, "summary": []})
        text = item["summary"][0]["text"]
        yield event("response.reasoning_summary_part.added", **base, summary_index=0, part={"type": "summary_text", "text": ""})
        for piece in _pieces(text):
            yield event("response.reasoning_summary_text.delta", **base, summary_index=0, delta=piece)
        yield event("response.reasoning_summary_text.done", **base, summary_index=0, text=text)
        yield event("response.reasoning_summary_part.done", **base, summary_index=0, part={"type": "summary_text", "text": text})
    elif item["type"] == "message":
        yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []})
        part = item["content"][0]
        yield event("response.content_part.added", **base, content_index=0, part={**part, "text": "", "logprobs": []})
        text_pieces = _pieces(part["text"])
        text_logprobs = (part["logprobs"] or [])[-len(text_pieces):] if part["logprobs"] else []
        for position, piece in enumerate(text_pieces):
            logprobs = [text_logprobs[position]] if text_logprobs else []
            yield event("response.output_text.delta", **base, content_index=0, delta=piece, logprobs=logprobs)
        yield event("response.output_text.done", **base, content_index=0, text=part["text"], logprobs=[])
        yield event("response.content_part.done", **base, content_index=0, part=part)
    else:
        yield event("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "arguments": ""})
        for piece in _pieces(item["arguments"]):
            yield event("response.function_call_arguments.delta", **base, delta=piece)
        yield event("response.function_call_arguments.done", **base, arguments=item["arguments"])
    yield event("response.output_item.done", output_index=index, item=item)


# -- Chat Completions --------------------------------------------------------------------------

def chat_reply(plan: Plan, serial: int, created: int, tokens: TokenOptions = TokenOptions(),
               weight_version: str = "default", aborted: bool = False) -> dict[str, Any]:
    """``aborted``: the engine stopped it after its reasoning (vLLM's ``finish_reason: "abort"``
    around a weight update): its text is empty; an agent resumes it with ``continue_final_message``."""
    message: dict[str, Any] = {"role": "assistant", "content": plan.text, "reasoning_content": plan.reasoning or None}
    if plan.tool_name:
        message["tool_calls"] = [{"id": plan.call_id, "type": "function",
                                  "function": {"name": plan.tool_name, "arguments": plan.tool_arguments}}]
    generated = generated_pieces(plan)
    # vLLM writes every key, null where nothing was asked (chat_completion/protocol.py).
    choice: dict[str, Any] = {
        "index": 0, "message": message,
        "logprobs": {"content": [_logprob_entry(piece, tokens) for piece in generated]} if tokens.logprobs else None,
        "finish_reason": "abort" if aborted else "tool_calls" if plan.tool_name else "stop",
        "token_ids": [token_id_of(piece) for piece in generated] if tokens.return_token_ids else None,
        # vLLM 0.33 (chat_completion/serving.py): the spans of the weight versions that sampled
        # the output, over its token indexes (vllm/outputs.py WeightVersionSpan), else null.
        "weight_versions": [{"version": weight_version, "start": 0, "end": len(generated)}]
        if tokens.return_weight_versions else None}
    reply = {
        "id": f"chatcmpl-standin-{serial}", "object": "chat.completion", "created": created, "model": STAND_IN_MODEL,
        "choices": [choice],
        "usage": {"prompt_tokens": plan.prompt_tokens, "completion_tokens": plan.output_tokens,
                  "total_tokens": plan.prompt_tokens + plan.output_tokens,
                  "prompt_tokens_details": {"cached_tokens": plan.cached_tokens},
                  "completion_tokens_details": {"reasoning_tokens": plan.reasoning_tokens}},
    }
    reply["prompt_token_ids"] = prompt_token_ids(plan, serial) if tokens.return_token_ids else None
    return reply


def generated_pieces(plan: Plan) -> list[str]:
    """The reply's tokens in the order they are generated: reasoning, then the text or the arguments."""
    said = plan.text if plan.text is not None else plan.tool_arguments
    return _pieces(plan.reasoning) + _pieces(said)


def chat_events(reply: dict[str, Any], include_usage: bool, tokens: TokenOptions = TokenOptions(),
                weight_version: Callable[[], str] = lambda: "default") -> Iterator[bytes]:
    """The reply as vLLM streams it, one chunk per token. ``weight_version``: the engine's label
    when each token is generated (read as the chunk is made: an update while the stream is
    written splits its spans, as vLLM 0.33's output_processor.py ``track_weight_version`` does)."""
    envelope = {key: reply[key] for key in ("id", "created", "model")}
    message = reply["choices"][0]["message"]
    spans: list[dict[str, Any]] = []

    def chunk(delta: dict[str, Any], finish_reason: str | None = None, piece: str | None = None, **extra: Any) -> bytes:
        choice: dict[str, Any] = {
            "index": 0, "delta": delta,
            "logprobs": {"content": [_logprob_entry(piece, tokens)]} if tokens.logprobs and piece is not None else None,
            "finish_reason": finish_reason,
            "token_ids": ([token_id_of(piece)] if piece is not None else []) if tokens.return_token_ids else None}
        if piece is not None:
            _track(spans, weight_version())
        if finish_reason is not None:  # vLLM 0.33: on the choice's last chunk only, null unless asked.
            choice["weight_versions"] = spans if tokens.return_weight_versions else None
        return sse(None, {**envelope, "object": "chat.completion.chunk", "choices": [choice], **extra})

    yield sse(None, {**envelope, "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
        "prompt_token_ids": reply["prompt_token_ids"]})
    for piece in _pieces(message["reasoning_content"] or ""):
        yield chunk({"reasoning_content": piece}, piece=piece)
    for piece in _pieces(message["content"]) if message["content"] else ():
        yield chunk({"content": piece}, piece=piece)
    for index, call in enumerate(message.get("tool_calls") or ()):
        yield chunk({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"], "arguments": ""}}]})
        for piece in _pieces(call["function"]["arguments"]):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, piece=piece)
    yield chunk({}, reply["choices"][0]["finish_reason"])
    if include_usage:
        yield sse(None, {**envelope, "object": "chat.completion.chunk", "choices": [], "usage": reply["usage"]})
    yield sse(None, "[DONE]")


def _track(spans: list[dict[str, Any]], version: str) -> None:
    """One more token sampled by ``version``: a new span when the version changed."""
    if spans and spans[-1]["version"] == version:
        spans[-1]["end"] += 1
    else:
        start = spans[-1]["end"] if spans else 0
        spans.append({"version": version, "start": start, "end": start + 1})


# -- Completions -------------------------------------------------------------------------------

def completions_reply(plan: Plan, serial: int, created: int, prompts: list[list[int]], n: int,
                      tokens: TokenOptions = TokenOptions(), texts: list[str] | None = None,
                      max_tokens: int | None = None, routing: ExpertRouting | None = None,
                      experts_start: int = 0) -> dict[str, Any]:
    """A ``text_completion`` as vLLM writes it (completion/protocol.py): one choice per prompt and
    sample, ``logprobs`` in the completions shape, ``token_ids`` / ``prompt_token_ids`` per choice.
    ``texts``: what is said to each prompt (default: the plan's text to all); ``max_tokens`` cuts
    each to that many tokens, ``finish_reason`` ``length`` then, else ``stop``."""
    texts = texts if texts is not None else [plan.text or ""] * len(prompts)
    choices, generated = [], 0
    for prompt_index, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
        pieces = _pieces(text) if text else []
        cut = max_tokens is not None and len(pieces) > max_tokens
        pieces = pieces[:max_tokens] if cut else pieces
        for sample in range(n):
            generated += len(pieces)
            choices.append({
                "index": prompt_index * n + sample, "text": "".join(pieces),
                "logprobs": _completions_logprobs(pieces, 0, tokens) if tokens.logprobs else None,
                "finish_reason": "length" if cut else "stop", "stop_reason": None,
                "token_ids": [token_id_of(piece) for piece in pieces] if tokens.return_token_ids else None,
                "prompt_logprobs": None, "prompt_token_ids": prompt if tokens.return_token_ids else None})
            if routing is not None:
                choices[-1]["routed_experts"] = routing.encoded([*prompt, *map(token_id_of, pieces)], experts_start)
    prompt_total = sum(len(prompt) for prompt in prompts)  # Once per prompt, whatever n (vLLM).
    return {"id": f"cmpl-standin-{serial}", "object": "text_completion", "created": created, "model": STAND_IN_MODEL,
            "choices": choices, "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": prompt_total, "total_tokens": prompt_total + generated,
                      "completion_tokens": generated, "prompt_tokens_details": None},
            "kv_transfer_params": None}


def _completions_logprobs(pieces: list[str], offset: int, tokens: TokenOptions) -> dict[str, Any]:
    text_offset, position = [], offset
    for piece in pieces:
        text_offset.append(position)
        position += len(piece)
    return {"text_offset": text_offset, "token_logprobs": [logprob_of(piece) for piece in pieces],
            "tokens": [f"token_id:{token_id_of(p)}" if tokens.return_tokens_as_token_ids else p for p in pieces],
            "top_logprobs": [{piece: logprob_of(piece), **{f"{piece}~{k}": round(logprob_of(piece) - k, 3)
                                                           for k in range(1, tokens.top_logprobs)}}
                             for piece in pieces]}


def completions_events(reply: dict[str, Any], include_usage: bool, tokens: TokenOptions = TokenOptions()) -> Iterator[bytes]:
    """One chunk per token and choice (choices interleaved, as vLLM sends n > 1; a shorter choice
    ends first), ``[DONE]`` last."""
    envelope = {key: reply[key] for key in ("id", "object", "created", "model")}
    pieces = {choice["index"]: _pieces(choice["text"]) if choice["text"] else [] for choice in reply["choices"]}
    offsets = {index: 0 for index in pieces}
    for position in range(max((len(said) for said in pieces.values()), default=0)):
        for choice in reply["choices"]:
            index = choice["index"]
            if position >= len(pieces[index]):
                continue
            piece = pieces[index][position]
            last = position == len(pieces[index]) - 1
            yield sse(None, {**envelope, "choices": [{
                "index": index, "text": piece,
                "logprobs": _completions_logprobs([piece], offsets[index], tokens) if tokens.logprobs else None,
                "finish_reason": choice["finish_reason"] if last else None, "stop_reason": None,
                "token_ids": [token_id_of(piece)] if tokens.return_token_ids else None, "prompt_logprobs": None,
                "prompt_token_ids": choice["prompt_token_ids"] if position == 0 else None}], "usage": None})
            offsets[index] += len(piece)
    if include_usage:
        yield sse(None, {**envelope, "choices": [], "usage": reply["usage"]})
    yield sse(None, "[DONE]")


# -- vLLM's token-in/token-out path ---------------------------------------------------------------

def generate_reply(serial: int, created: int, prompt: list[int], text: str, max_tokens: int | None, logprobs: bool,
                   return_token_ids: bool) -> dict[str, Any]:
    """A ``GenerateTokensResponse`` as vLLM writes it (``scale_out/token_in_token_out/protocol.py``):
    no ``object``; per choice the generated ``token_ids`` and, when ``sampling_params.logprobs`` is
    set, ``logprobs.content`` entries with integer ``token_id``; ``prompt_token_ids`` only with
    ``return_token_ids``."""
    pieces = _pieces(text)
    cut = max_tokens is not None and len(pieces) > max_tokens
    pieces = pieces[:max_tokens] if cut else pieces
    content = [{"token_id": token_id_of(piece), "logprob": logprob_of(piece), "rank": 1, "top_logprobs": []}
               for piece in pieces]
    return {"request_id": f"gen-standin-{serial}", "model": STAND_IN_MODEL, "created": created,
            "output_mode": "tokens",
            "choices": [{"index": 0, "finish_reason": "length" if cut else "stop", "stop_reason": None,
                         "token_ids": [token_id_of(piece) for piece in pieces],
                         "logprobs": {"content": content} if logprobs else None}],
            "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(pieces),
                      "completion_tokens": len(pieces)},
            "prompt_token_ids": prompt if return_token_ids else None}


def generate_events(reply: dict[str, Any], include_usage: bool) -> Iterator[bytes]:
    """One chunk per token (the first with ``prompt_token_ids`` when asked), the last with the finish
    reason, the usage chunk when asked, ``[DONE]``: vLLM's ``serving.py`` stream."""
    choice = reply["choices"][0]
    ids, entries = choice["token_ids"], (choice["logprobs"] or {}).get("content")
    for position, token in enumerate(ids):
        chunk: dict[str, Any] = {"request_id": reply["request_id"], "output_mode": "tokens", "choices": [{
            "index": 0, "finish_reason": choice["finish_reason"] if position == len(ids) - 1 else None,
            "token_ids": [token], "logprobs": {"content": [entries[position]]} if entries is not None else None}]}
        if position == 0 and reply["prompt_token_ids"] is not None:
            chunk["prompt_token_ids"] = reply["prompt_token_ids"]
        if position == len(ids) - 1 and "routed_experts" in choice:  # Known once the request finished.
            chunk["choices"][0]["routed_experts"] = choice["routed_experts"]
        yield sse(None, chunk)
    if include_usage:
        yield sse(None, {"request_id": reply["request_id"], "output_mode": "tokens", "choices": [], "usage": reply["usage"]})
    yield sse(None, "[DONE]")


# -- Anthropic Messages ------------------------------------------------------------------------

def messages_reply(plan: Plan, serial: int, thinking: bool = False) -> dict[str, Any]:
    """An Anthropic Messages reply; a thinking block first only when the request turned thinking on
    (``"thinking": {"type": "enabled", ...}``), as Anthropic answers, so ``content[0].text`` is the
    answer of a plain request."""
    content: list[dict[str, Any]] = []
    if thinking:
        content.append({"type": "thinking", "thinking": plan.reasoning, "signature": f"sig-standin-{serial}"})
    if plan.text is not None:
        content.append({"type": "text", "text": plan.text})
    else:
        content.append({"type": "tool_use", "id": f"toolu_standin_{serial}", "name": plan.tool_name,
                        "input": orjson.loads(plan.tool_arguments)})
    return {
        "id": f"msg_standin_{serial}", "type": "message", "role": "assistant", "model": STAND_IN_MODEL,
        "content": content, "stop_reason": "end_turn" if plan.text is not None else "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": plan.prompt_tokens - plan.cached_tokens, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": plan.cached_tokens,
                  "output_tokens": plan.output_tokens if thinking else plan.output_tokens - plan.reasoning_tokens},
    }


def messages_events(reply: dict[str, Any]) -> Iterator[bytes]:
    start_usage = {**reply["usage"], "output_tokens": 1}
    yield sse("message_start", {"type": "message_start",
                                "message": {**reply, "content": [], "stop_reason": None, "usage": start_usage}})
    yield sse("ping", {"type": "ping"})
    for index, block in enumerate(reply["content"]):
        yield from _messages_block_events(index, block)
    yield sse("message_delta", {"type": "message_delta",
                                "delta": {"stop_reason": reply["stop_reason"], "stop_sequence": None},
                                "usage": {"output_tokens": reply["usage"]["output_tokens"]}})
    yield sse("message_stop", {"type": "message_stop"})


def _messages_block_events(index: int, block: dict[str, Any]) -> Iterator[bytes]:
    def delta(payload: dict[str, Any]) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": payload})

    empty = {"thinking": {"type": "thinking", "thinking": "", "signature": ""}, "text": {"type": "text", "text": ""},
             "tool_use": {**block, "input": {}}}[block["type"]]
    yield sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": empty})
    if block["type"] == "thinking":
        for piece in _pieces(block["thinking"]):
            yield delta({"type": "thinking_delta", "thinking": piece})
        yield delta({"type": "signature_delta", "signature": block["signature"]})
    elif block["type"] == "text":
        for piece in _pieces(block["text"]):
            yield delta({"type": "text_delta", "text": piece})
    else:
        for piece in _pieces(orjson.dumps(block["input"]).decode()):
            yield delta({"type": "input_json_delta", "partial_json": piece})
    yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
