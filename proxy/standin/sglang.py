"""The stand-in answering chat as SGLang does (``mcc stand-in --engine sglang``; docs/tokens.md), its
shapes read from SGLang's ``entrypoints/openai/serving_chat.py``, ``protocol.py`` and ``sse_utils.py``:

- a JSON reply: ``id``, ``object``, ``created``, ``model``, ``choices`` (each with ``logprobs``,
  null unless asked, and ``matched_stop``), ``usage``, ``metadata`` (the weights' ``weight_version``),
  and a response-level ``sglext`` only when something is in it: the prompt's ``input_ids``
  (``return_input_ids_in_sglext``) and each choice's ``output_ids`` (``return_output_ids_in_sglext``);
- a stream: a role chunk, a chunk per token (its delta without null members, ``logprobs`` null
  unless asked), a finish chunk, then the ``sglext`` chunk (``choices: []``), the usage chunk when
  asked, ``[DONE]``. SGLang refuses ``return_token_ids`` on a stream (400).

The reply is the plan's reasoning (``reasoning_content``, as SGLang's reasoning parser separates it)
then its text (or its tool call's arguments) as content, the ids generated in that order.
"""

from __future__ import annotations

from typing import Any, Iterator

from .replies import STAND_IN_MODEL, Plan, generated_pieces, logprob_of, prompt_token_ids, sse, text_pieces, token_id_of


def _entry(piece: str) -> dict[str, Any]:
    return {"token": piece, "bytes": list(piece.encode()), "logprob": logprob_of(piece), "top_logprobs": []}


def sglang_chat_reply(plan: Plan, serial: int, created: int, request: dict[str, Any], weight_version: str) -> dict[str, Any]:
    """The JSON reply SGLang writes for ``request``, with what it asked for."""
    said = plan.text if plan.text is not None else plan.tool_arguments
    pieces = generated_pieces(plan)
    logprobs = request.get("logprobs") is True
    choice = {"index": 0, "message": {"role": "assistant", "content": said, "reasoning_content": plan.reasoning or None,
                                      "tool_calls": None},
              "logprobs": {"content": [_entry(piece) for piece in pieces]} if logprobs else None,
              "finish_reason": "stop", "matched_stop": None}
    prompt = prompt_token_ids(plan, serial)
    reply: dict[str, Any] = {
        "id": f"sglang-standin-{serial}", "object": "chat.completion", "created": created, "model": STAND_IN_MODEL,
        "choices": [choice],
        "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + len(pieces),
                  "completion_tokens": len(pieces), "prompt_tokens_details": None, "reasoning_tokens": 0},
        "metadata": {"weight_version": weight_version}}
    sglext: dict[str, Any] = {}
    if request.get("return_input_ids_in_sglext") is True:
        sglext["input_ids"] = prompt
    if request.get("return_output_ids_in_sglext") is True:
        sglext["output_ids"] = [[token_id_of(piece) for piece in pieces]]
    if sglext:
        reply["sglext"] = sglext
    return reply


def sglang_chat_events(reply: dict[str, Any], include_usage: bool) -> Iterator[bytes]:
    """The reply as SGLang streams it."""
    envelope = {"id": reply["id"], "object": "chat.completion.chunk", "created": reply["created"], "model": reply["model"]}
    choice = reply["choices"][0]
    entries = (choice["logprobs"] or {}).get("content")

    def chunk(delta: dict[str, Any], logprobs: Any = None, finish_reason: Any = None) -> bytes:
        return sse(None, {**envelope, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs,
                                                   "finish_reason": finish_reason, "matched_stop": None}]})

    yield chunk({"role": "assistant", "content": ""})
    message = choice["message"]
    said = [("reasoning_content", piece) for piece in text_pieces(message["reasoning_content"] or "")]
    said += [("content", piece) for piece in text_pieces(message["content"])]
    for position, (member, piece) in enumerate(said):
        yield chunk({member: piece}, {"content": [entries[position]]} if entries is not None else None)
    yield chunk({}, finish_reason=choice["finish_reason"])
    if "sglext" in reply:
        yield sse(None, {**envelope, "choices": [], "usage": None, "sglext": reply["sglext"]})
    if include_usage:
        yield sse(None, {**envelope, "choices": [], "usage": reply["usage"]})
    yield sse(None, "[DONE]")


def sglang_server_info() -> dict[str, Any]:
    """``GET /server_info``: SGLang's server arguments and version (what `--engine auto` asks)."""
    return {"model_path": STAND_IN_MODEL, "tokenizer_path": STAND_IN_MODEL, "tp_size": 1, "dp_size": 1,
            "enable_return_routed_experts": False, "version": "0.5.10"}
