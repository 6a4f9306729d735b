"""The built-in stand-in model server: speaks Responses, Chat Completions, Completions and Anthropic Messages.

It is what `mcc demo` and `mcc serve --stand-in` put behind the sidecar, so the product can be
tried with the real SDK clients on any machine, without a GPU. Replies are deterministic.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import replace
from typing import Any, Callable, Iterable

import orjson
from aiohttp import web

from ._encoding import asked_encoding, compressor
from .sglang import sglang_chat_events, sglang_chat_reply, sglang_server_info
from .replies import (
    STAND_IN_MODEL,
    ExpertRouting,
    Plan,
    ResponsesTokenOptions,
    TokenOptions,
    chat_events,
    generate_events,
    generate_reply,
    TEMPLATES,
    chat_prompt_ids,
    chat_reply,
    generated_pieces,
    prompt_token_ids,
    token_id_of,
    completions_events,
    completions_reply,
    make_plan,
    messages_events,
    messages_reply,
    responses_events,
    responses_messages,
    responses_reply,
    text_token_ids,
)

#: Replies carry this fixed creation time (2026-01-01T00:00:00Z) so equal requests get equal bytes.
STAND_IN_CREATED = 1767225600


#: As large as the sidecar's default --max-body-bytes: a long prompt the sidecar forwards is served.
STAND_IN_MAX_BODY = 256 * 1024 * 1024


def create_stand_in_app(delay: float = 0.0, template: str = "chain", force_include_usage: bool = False,
                        routing: ExpertRouting | None = None, engine: str = "vllm") -> web.Application:
    """The stand-in's routes; ``delay`` seconds pass before each model reply (a generation's time,
    so calls are seen in flight: `mcc stand-in --delay`); ``template``: its chat template
    (`TEMPLATES`), which a request may choose with the ``X-Stand-In-Template`` header;
    ``force_include_usage``: every stream ends with its usage chunk, asked for or not (vLLM's
    ``--enable-force-include-usage``); ``routing``: a MoE model's shape, every non-streamed chat and
    completions reply and every generate reply then carries ``routed_experts`` (vLLM's
    ``--enable-return-routed-experts``); ``engine``: ``sglang`` answers chat as SGLang does
    (`proxy.standin.sglang`), with its ``GET /server_info``."""
    if template not in TEMPLATES:
        raise ValueError(f"template must be one of {TEMPLATES}, not {template!r}")
    app = web.Application(client_max_size=STAND_IN_MAX_BODY, middlewares=[_delayed(delay)] if delay > 0 else [])
    app[TEMPLATE] = template
    app[FORCE_INCLUDE_USAGE] = force_include_usage
    app[ROUTING] = routing
    app[ENGINE] = engine
    app[STORED_RESPONSES] = {}
    app[WEIGHT_VERSION] = ["default"]  # vLLM 0.33's engine label until an update (v1/engine/core.py).
    app.router.add_post("/v1/responses", _responses)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_post("/v1/messages", _messages)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/inference/v1/generate", _generate)
    if engine == "vllm":  # vLLM's renderer (prefix supply asks it: docs/tokens.md); SGLang's differs.
        app.router.add_post("/tokenize", _tokenize)
    if engine == "sglang":
        app.router.add_get("/server_info", _server_info)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_post("/update_weight_version", _update_weight_version)
    app.router.add_get("/weight_info", _weight_info)
    return app


def _include_usage(request: web.Request, body: dict[str, Any]) -> bool:
    """Whether a stream ends with its usage chunk: asked (``stream_options.include_usage``), or
    forced for every stream (``--force-include-usage``, as vLLM's ``--enable-force-include-usage``)."""
    return request.app[FORCE_INCLUDE_USAGE] or bool((body.get("stream_options") or {}).get("include_usage"))


def _delayed(delay: float) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST":
            await asyncio.sleep(delay)
        return await handler(request)
    return middleware


async def _responses(request: web.Request) -> web.StreamResponse:
    body, raw = await _json_body(request)
    items = body.get("input")
    items = [{"role": "user", "content": items}] if isinstance(items, str) else (items or [])
    stored = request.app[STORED_RESPONSES]
    earlier = body.get("previous_response_id")
    if earlier is not None and earlier not in stored:
        raise web.HTTPNotFound(text=orjson.dumps({"error": {
            "message": f"Response with id '{earlier}' not found.", "type": "invalid_request_error",
            "param": "previous_response_id", "code": 404}}).decode(), content_type="application/json")
    # The prompt's ids as vLLM renders a Responses request: its items as chat messages, then the template.
    messages = responses_messages(body, *(stored[earlier] if earlier is not None else (None, None)))
    prompt, raw = _supplied_prompt(body, raw, chat_prompt_ids(messages, _text_of, _template(request)))
    serial = _serial(raw)
    plan = make_plan(len(raw), _last_user_text(items), _first_tool_name(body, lambda tool: tool.get("name")),
                     any(isinstance(item, dict) and item.get("type") == "function_call_output" for item in items),
                     serial, prompt)
    reply = responses_reply(plan, serial, STAND_IN_CREATED, ResponsesTokenOptions.from_request(body))
    if body.get("store", True) is not False:  # vLLM keeps each stored response's messages and output.
        if len(stored) >= _STORED_MAX:
            stored.pop(next(iter(stored)))
        stored[reply["id"]] = (messages, reply["output"])
    if body.get("stream"):
        return await _stream(request, responses_events(reply))
    return _json_reply(request, reply)


async def _chat(request: web.Request) -> web.StreamResponse:
    body, raw = await _json_body(request)
    messages = body.get("messages") or []
    resuming = body.get("continue_final_message") is True and bool(messages) and isinstance(messages[-1], dict) \
        and messages[-1].get("role") == "assistant"
    prompt, raw = _supplied_prompt(body, raw, chat_prompt_ids(messages if isinstance(messages, list) else [], _text_of,
                                                              _template(request), resuming))
    plan = make_plan(len(raw), _last_user_text(messages),
                     _first_tool_name(body, lambda tool: (tool.get("function") or {}).get("name")),
                     any(isinstance(m, dict) and m.get("role") == "tool" for m in messages), _serial(raw), prompt)
    # X-Stand-In-Abort: after-reasoning stops a text reply after its reasoning, as vLLM aborts around a
    # weight update; the agent resumes it (``continue_final_message``): the rest, its text, comes then.
    aborted = request.headers.get("X-Stand-In-Abort") == "after-reasoning" and plan.text is not None and not resuming
    if aborted:
        plan = replace(plan, text="")
    elif resuming:
        plan = replace(plan, reasoning="")
    version = request.app[WEIGHT_VERSION]
    if request.app[ENGINE] == "sglang":
        return await _sglang_chat(request, body, plan, _serial(raw), version[0])
    tokens = TokenOptions.from_request(body)
    reply = chat_reply(plan, _serial(raw), STAND_IN_CREATED, tokens, version[0], aborted)
    if body.get("stream"):
        include_usage = _include_usage(request, body)
        return await _stream(request, chat_events(reply, include_usage, tokens, lambda: version[0]))
    routing = request.app[ROUTING]
    if routing is not None:  # vLLM's chat serving.py: on the non-streamed choice only.
        prompt = prompt_token_ids(plan, _serial(raw))
        sequence = [*prompt, *(token_id_of(piece) for piece in generated_pieces(plan))]
        reply["choices"][0]["routed_experts"] = routing.encoded(sequence, _experts_start(body, len(prompt)))
    return _json_reply(request, reply)


def _supplied_prompt(body: dict[str, Any], raw: bytes, rendered: list[int]) -> tuple[list[int], bytes]:
    """The prompt and the bytes the reply is derived from: vLLM 0.32 takes
    ``kv_transfer_params.prompt_token_ids`` as the prompt itself (prefix supply, chat and
    Responses), so the reply is what that prompt gets -- the same as without the field when it
    is the rendered one."""
    kv = body.get("kv_transfer_params")
    supplied = kv.get("prompt_token_ids") if isinstance(kv, dict) else None
    if not (isinstance(supplied, list) and supplied and all(_integer(token) for token in supplied)):
        return rendered, raw
    if supplied == rendered:
        raw = orjson.dumps({key: value for key, value in orjson.loads(raw).items() if key != "kv_transfer_params"})
    return supplied, raw


async def _tokenize(request: web.Request) -> web.Response:
    """vLLM's ``POST /tokenize`` of a chat (``messages``, ``add_generation_prompt``,
    ``continue_final_message``): the stand-in template's ids, as a chat call's prompt is rendered."""
    body, _ = await _json_body(request)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _bad_request("the stand-in renders chats only: give messages")
    resuming = body.get("continue_final_message") is True
    ids = chat_prompt_ids(messages, _text_of, _template(request), resuming)
    if not resuming and body.get("add_generation_prompt", True) is False:
        ids = ids[:-2]  # No generation prompt: the template's last two ids open the assistant's turn.
    return web.json_response({"count": len(ids), "max_model_len": 32768, "tokens": ids, "token_strs": None})


async def _sglang_chat(request: web.Request, body: dict[str, Any], plan: Plan, serial: int,
                       weight_version: str) -> web.StreamResponse:
    if body.get("stream") and body.get("return_token_ids"):
        raise _bad_request("return_token_ids is not supported with streaming on /v1/chat/completions. Please set "
                           "stream=false when using return_token_ids=true.")
    reply = sglang_chat_reply(plan, serial, STAND_IN_CREATED, body, weight_version)
    if body.get("stream"):
        return await _stream(request, sglang_chat_events(reply, _include_usage(request, body)))
    return _json_reply(request, reply)


async def _server_info(request: web.Request) -> web.Response:
    return web.json_response(sglang_server_info())


async def _completions(request: web.Request) -> web.StreamResponse:
    """The legacy completions dialect: a prompt as text, a list of texts, token ids or lists of them;
    each prompt gets its own reply (a token-id prompt is answered by its length), ``n`` samples of
    it, cut at ``max_tokens`` (``finish_reason`` ``length``) as vLLM does."""
    body, raw = await _json_body(request)
    given = _prompts(body.get("prompt"))
    if given is None:
        raise _bad_request("prompt must be text, a list of texts, token ids or lists of token ids")
    n, max_tokens = body.get("n", 1), body.get("max_tokens")
    if n is None:
        n = 1
    if not _integer(n) or not 1 <= n <= MAX_N:
        raise _bad_request(f"n must be an integer from 1 to {MAX_N}, not {n!r}")
    if max_tokens is not None and (not _integer(max_tokens) or max_tokens < 1):
        raise _bad_request(f"max_tokens must be at least 1, got {max_tokens!r}")
    tokens = TokenOptions.from_completions_request(body)
    plan = _plan(raw, "", None, False)
    routing = request.app[ROUTING] if not body.get("stream") else None  # completion/serving.py: JSON replies.
    experts_start = _experts_start(body, min(len(ids) for ids, _ in given)) if routing is not None else 0
    reply = completions_reply(plan, _serial(raw), STAND_IN_CREATED, [ids for ids, _ in given], n, tokens,
                              [_completion_text(text, ids) for ids, text in given], max_tokens, routing, experts_start)
    if body.get("stream"):
        include_usage = _include_usage(request, body)
        return await _stream(request, completions_events(reply, include_usage, tokens))
    return _json_reply(request, reply)


async def _generate(request: web.Request) -> web.StreamResponse:
    """vLLM's token-in/token-out path: the prompt's ``token_ids`` in, generated ids out; the stand-in
    answers with the prompt's length, cut at ``sampling_params.max_tokens``."""
    body, raw = await _json_body(request)
    prompt, params = body.get("token_ids"), body.get("sampling_params")
    if not isinstance(prompt, list) or not prompt or not all(_integer(token) and token >= 0 for token in prompt):
        raise _bad_request("token_ids must be a non-empty list of non-negative token ids")
    if not isinstance(params, dict):
        raise _bad_request("sampling_params must be an object")
    max_tokens = params.get("max_tokens")
    if max_tokens is not None and (not _integer(max_tokens) or max_tokens < 1):
        raise _bad_request(f"max_tokens must be at least 1, got {max_tokens!r}")
    reply = generate_reply(_serial(raw), STAND_IN_CREATED, prompt, _completion_text(None, prompt), max_tokens,
                           params.get("logprobs") is not None, bool(body.get("return_token_ids")))
    routing = request.app[ROUTING]
    if routing is not None:  # On the JSON reply's choice and a stream's last chunk (token_in_token_out/serving.py).
        choice = reply["choices"][0]
        choice["routed_experts"] = routing.encoded([*prompt, *choice["token_ids"]], _experts_start(params, len(prompt)))
    if body.get("stream"):
        return await _stream(request, generate_events(reply, _include_usage(request, body)))
    return _json_reply(request, reply)


#: The most samples a completions request may ask for (``n``).
MAX_N = 16


def _completion_text(text: str | None, ids: list[int]) -> str:
    """What the stand-in says to one prompt: its text echoed, or a token-id prompt's length."""
    if text is not None:
        return f"Hello from the stand-in model. You said: {text[:80]}"
    return f"Hello from the stand-in model. You sent {len(ids)} prompt tokens."


def _experts_start(fields: dict[str, Any], prompt_tokens: int) -> int:
    """``routed_experts_prompt_start``: 0 to the prompt's length (vLLM's input_processor.py refuses others)."""
    start = fields.get("routed_experts_prompt_start", 0)
    if not _integer(start) or not 0 <= start <= prompt_tokens:
        raise _bad_request(f"routed_experts_prompt_start must be between 0 and {prompt_tokens}, got {start!r}")
    return start


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad_request(message: str) -> web.HTTPBadRequest:
    """A 400 in vLLM's error shape."""
    return web.HTTPBadRequest(text=orjson.dumps({"error": {"message": message, "type": "BadRequestError",
                                                            "param": None, "code": 400}}).decode(),
                              content_type="application/json")


def _prompts(prompt: Any) -> list[tuple[list[int], str | None]] | None:
    """Each prompt as token ids (text through the stand-in tokenizer) and its text (None when it
    came as ids); None for a prompt of no shape the dialect takes."""
    if isinstance(prompt, str):
        return [(text_token_ids(prompt), prompt)]
    if isinstance(prompt, list) and prompt:
        if all(_integer(item) for item in prompt):
            return [(prompt, None)]
        if all(isinstance(item, str) for item in prompt):
            return [(text_token_ids(item), item) for item in prompt]
        if all(isinstance(item, list) and item and all(_integer(i) for i in item) for item in prompt):
            return [(item, None) for item in prompt]
    return None


async def _messages(request: web.Request) -> web.StreamResponse:
    body, raw = await _json_body(request)
    messages = body.get("messages") or []
    has_result = any(isinstance(block, dict) and block.get("type") == "tool_result"
                     for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
                     for block in m["content"])
    plan = _plan(raw, _last_user_text(messages), _first_tool_name(body, lambda tool: tool.get("name")), has_result)
    thinking = body.get("thinking")
    reply = messages_reply(plan, _serial(raw), isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"))
    if body.get("stream"):
        return await _stream(request, messages_events(reply))
    return _json_reply(request, reply)


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": STAND_IN_MODEL, "object": "model", "owned_by": "mcc"}]})


async def _health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def _update_weight_version(request: web.Request) -> web.Response:
    """vLLM 0.33's ``POST /update_weight_version`` (entrypoints/rl/online/api_router.py): the label
    of the weights loaded from now on; tokens generated after it carry it."""
    body, _ = await _json_body(request)
    version = body.get("new_version")
    if not isinstance(version, str) or not version:
        raise _bad_request("new_version must be a non-empty string")
    request.app[WEIGHT_VERSION][0] = version
    return web.json_response({"success": True, "new_version": version})


async def _weight_info(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": request.app[WEIGHT_VERSION][0]})


async def _stream(request: web.Request, events: Iterable[bytes]) -> web.StreamResponse:
    """Each event written as it is made; ``X-Stand-In-Pace: S`` waits S seconds after each (a
    generation's pace, so a stream is seen in flight: weight updates mid-stream)."""
    encoding = asked_encoding(request.headers)
    headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    if encoding is not None:
        events = _compressed(events, compressor(encoding))
    try:
        pace = float(request.headers.get("X-Stand-In-Pace") or 0)
    except ValueError:
        pace = 0.0
    for event in events:
        await response.write(event)
        if pace > 0:
            await asyncio.sleep(pace)
    await response.write_eof()
    return response


def _compressed(events: Iterable[bytes], coder: Any) -> Iterable[bytes]:
    for event in events:
        yield coder.piece(event)
    yield coder.end()


def _json_reply(request: web.Request, reply: Any) -> web.Response:
    """The reply as JSON, compressed when the request asked (`X-Stand-In-Encoding`)."""
    body = orjson.dumps(reply)
    encoding = asked_encoding(request.headers)
    if encoding is None:
        return web.Response(body=body, content_type="application/json", charset="utf-8")
    coder = compressor(encoding)
    return web.Response(body=coder.piece(body) + coder.end(), content_type="application/json", charset="utf-8",
                        headers={"Content-Encoding": encoding})


async def _json_body(request: web.Request) -> tuple[dict[str, Any], bytes]:
    """The body parsed, and the bytes its reply's ids and sizes are derived from."""
    raw = await request.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise web.HTTPBadRequest(text='{"error": {"message": "body is not JSON", "type": "invalid_request_error"}}',
                                 content_type="application/json") from None
    body = body if isinstance(body, dict) else {}
    if any(name in body for name in _RETURN_FIELDS):
        # What is asked back (token ids, logprobs) never changes what is generated, as on vLLM
        # with a fixed seed: the reply's ids and sizes come from the request without those fields.
        raw = orjson.dumps({key: value for key, value in body.items() if key not in _RETURN_FIELDS})
    return body, raw


#: Request fields that say what to return, not what to generate.
_RETURN_FIELDS = frozenset({"logprobs", "top_logprobs", "return_token_ids", "return_tokens_as_token_ids", "include",
                            "enable_response_messages", "return_weight_versions", "return_input_ids_in_sglext",
                            "return_output_ids_in_sglext"})


def _plan(raw: bytes, user_text: str, tool_name: str | None, has_tool_result: bool) -> Plan:
    return make_plan(len(raw), user_text, tool_name, has_tool_result, _serial(raw))


def _serial(raw: bytes) -> int:
    """A number derived from the request body: the same request gets the same ids back."""
    return zlib.crc32(raw) % 1_000_000


def _first_tool_name(body: dict[str, Any], name_of: Callable[[dict[str, Any]], Any]) -> str | None:
    for tool in body.get("tools") or ():
        if isinstance(tool, dict) and isinstance(name_of(tool), str):
            return name_of(tool)
    return None


def _last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


TEMPLATE = web.AppKey("template", str)
#: Stored Responses (``store``, on by default as in vLLM) by id: the messages and output a later
#: request's ``previous_response_id`` continues; the oldest go past `_STORED_MAX`.
STORED_RESPONSES = web.AppKey("stored_responses", dict)
_STORED_MAX = 10_000
WEIGHT_VERSION = web.AppKey("weight_version", list)
FORCE_INCLUDE_USAGE = web.AppKey("force_include_usage", bool)
#: A MoE model's shape, or None: replies then carry ``routed_experts`` (`create_stand_in_app`).
ROUTING: web.AppKey[ExpertRouting | None] = web.AppKey("routing")
#: ``vllm``, or ``sglang``: chat answered as SGLang does (`create_stand_in_app`).
ENGINE = web.AppKey("engine", str)


def _template(request: web.Request) -> str:
    """The chat template for this request: the header's, when it names one, else the app's."""
    asked = request.headers.get("X-Stand-In-Template")
    return asked if asked in TEMPLATES else request.app[TEMPLATE]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict) and "text" in part)
    return ""


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()
