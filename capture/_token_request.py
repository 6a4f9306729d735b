"""The token capture mode's request half, sans-io (docs/tokens.md): what to add to an agent's request so
that vLLM returns the sampled token ids and their logprobs, and the bytes that add it.

What vLLM 0.32.0 takes, read from its source (``vllm/entrypoints/openai/chat_completion/protocol.py``,
``completion/protocol.py``, ``responses/protocol.py``):

- chat: ``logprobs: true`` and ``return_token_ids: true``;
- completions: ``logprobs: 0`` (the sampled token's logprob, no alternatives) and ``return_token_ids``;
- both, for vLLM 0.33: ``return_weight_versions: true`` (each choice's ``weight_versions``, the
  weight version that sampled each range of its tokens; issue 32). vLLM 0.32 ignores the field
  (its request models allow unknown fields, with a warning in its log) and replies as it would;
- Responses: ``include: ["message.output_text.logprobs"]`` and ``enable_response_messages``
  (refused for ``background`` requests); it has no ``return_token_ids``;
- Messages: nothing (vLLM's Anthropic endpoint has no field for either).

SGLang (``--engine sglang``; its ``entrypoints/openai/serving_chat.py``): chat only, with
``logprobs: true`` and ``return_input_ids_in_sglext`` / ``return_output_ids_in_sglext``: the ids come
in a response-level ``sglext`` object (a stream's own last chunk, ``choices: []``), cut whole. A
request that asks for any ``sglext`` field itself gets nothing added (its ``sglext`` is its own).

The mode never changes the verdict on the agent's own request, nor what its reply says: where an
added field would turn a request vLLM refuses into one it accepts (``top_logprobs`` without
``logprobs``), or change the reply beyond what the cut removes (``echo`` on completions), nothing
is added and the agent's request goes as it came.
"""

from __future__ import annotations

from typing import Any, Optional

import orjson

#: The fields each dialect gets, in the order they are added, with the values sent.
TOKEN_FIELDS: dict[str, tuple[tuple[str, Any], ...]] = {
    "chat": (("logprobs", True), ("return_token_ids", True), ("return_weight_versions", True)),
    "completions": (("logprobs", 0), ("return_token_ids", True), ("return_weight_versions", True)),
    "responses": (("include", ["message.output_text.logprobs"]), ("enable_response_messages", True)),
    "messages": (),
}

#: SGLang's: chat only (`SGLANG_OWN_SGLEXT` requests get none).
SGLANG_TOKEN_FIELDS: dict[str, tuple[tuple[str, Any], ...]] = {
    "chat": (("logprobs", True), ("return_input_ids_in_sglext", True), ("return_output_ids_in_sglext", True)),
}
#: Request fields that put something in SGLang's ``sglext`` (serving_chat.py ``SglExt``).
SGLANG_OWN_SGLEXT = ("return_input_ids_in_sglext", "return_output_ids_in_sglext", "return_routed_experts",
                     "return_cached_tokens_details", "return_spec_tokens_details")
#: The ``sglext`` members the added fields put there.
SGLEXT_ID_FIELDS = {"return_input_ids_in_sglext": "input_ids", "return_output_ids_in_sglext": "output_ids"}

#: Strings pydantic v2 (vLLM's request models, lax mode) reads as booleans.
_TRUE_STRINGS = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE_STRINGS = frozenset({"0", "off", "f", "false", "n", "no"})


def token_fields_to_add(dialect: str, request: dict[str, Any], refused: frozenset[str] = frozenset(),
                        engine: str = "vllm") -> dict[str, Any]:
    """The fields to add to ``request`` (parsed): those of `TOKEN_FIELDS` (SGLang's:
    `SGLANG_TOKEN_FIELDS`) the agent did not set (a field it set, even to null or false, is its
    own), minus those the upstream ``refused``; none at all when adding them would change the
    engine's verdict on the request or its reply."""
    if _fields_would_change_the_reply(dialect, request):
        return {}
    if engine == "sglang" and any(request.get(name) for name in SGLANG_OWN_SGLEXT):
        return {}
    added = {}
    for name, value in (SGLANG_TOKEN_FIELDS if engine == "sglang" else TOKEN_FIELDS).get(dialect, ()):
        if name not in request and name not in refused:
            added[name] = value
    if dialect == "responses" and vllm_bool(request.get("background")):
        added.pop("enable_response_messages", None)  # vLLM refuses it for background requests.
    return added


def _fields_would_change_the_reply(dialect: str, request: dict[str, Any]) -> bool:
    """vLLM 0.32's validators (``check_logprobs``) and serving code, where an added field matters."""
    logprobs = request.get("logprobs")
    if dialect == "chat":
        top = request.get("top_logprobs")
        numeric_top = isinstance(top, (int, float)) and (top == -1 or top > 0)  # bool too, as vLLM's check
        # "when using `top_logprobs` / `logprob_token_ids`, `logprobs` must be set to true": a 400
        # the agent gets directly; adding `logprobs: true` would make it a 200.
        return (numeric_top or bool(request.get("logprob_token_ids"))) and not vllm_bool(logprobs)
    if dialect == "completions":
        # `echo` with `return_token_ids` blanks the echoed prompt text, and with `logprobs` adds
        # `prompt_logprobs` to the reply (completion/serving.py): not what the agent asked for.
        if vllm_bool(request.get("echo")):
            return True
        # "when using `logprob_token_ids`, `logprobs` must be set": adding `logprobs: 0` sets it.
        return bool(request.get("logprob_token_ids")) and logprobs is None
    return False


def vllm_bool(value: Any) -> bool:
    """``value`` as vLLM's pydantic request models read a boolean field (lax mode): ``"false"``,
    ``"0"``, ``0`` are False; anything it would refuse counts as False too (the request fails
    either way)."""
    if type(value) is bool:
        return value
    if type(value) in (int, float):
        return value == 1
    if type(value) is str:
        return value.strip().lower() in _TRUE_STRINGS
    return False


def add_request_fields(body: bytes, fields: dict[str, Any]) -> Optional[bytes]:
    """``body`` (a JSON object) with ``fields`` inserted before its closing brace, else None."""
    end = body.rstrip().rfind(b"}")
    if end < 0 or not fields:
        return None
    inserted = b",".join(orjson.dumps(name) + b":" + orjson.dumps(value) for name, value in fields.items())
    before = body[:end].rstrip()
    separator = b"" if before.endswith(b"{") else b","
    return body[:end] + separator + inserted + body[end:]
