"""A rollout as an ATIF v1.7 trajectory (docs/reading.md, "ATIF"): the interchange NeMo Gym 0.7.0 exports
and Harbor reads, in the subset Gym's strict models accept.

One document per rollout. Steps come in the order the agent saw them: the first call's system and
user turns, then per call the turns its request added since the last reply (a user's new turn, the
tools' results -- each an observation of the agent step whose tool call it answers) and the reply
itself as an agent step (text, reasoning, tool calls, the call's token counts and, where the token
capture mode or the engine gave them, its prompt and completion token ids and logprobs). History a
first request carried that no captured reply produced is kept as agent steps marked
``is_copied_context``. Calls of another agent of the harness (its sub-agents: the
``client_agent_id`` / ``client_parent_agent_id`` headers) are documents of their own, in
``subagent_trajectories``.

An ended rollout's outcome (`records.end_rollout`: reward, metrics) is the root's ``extra``
(``{"outcome", "ended_at", "group"}``): ATIF's place for custom root-level metadata, as ATIF has no
reward field; a document of a rollout with no end has none.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Optional

from ..contract import TokenRecord
from ..store import ModelCallRecord, capture_store, read_model_call_records, read_rollout_end
from ._token_records_reading import read_token_records

ATIF_SCHEMA_VERSION = "ATIF-v1.7"
#: The agent named in a document when the harness named none (`to_atif`'s ``agent_name``).
DEFAULT_AGENT = "model-call-capture"


def to_atif(captures: object, rollout_id: str, *, agent_name: str = DEFAULT_AGENT, agent_version: str = "unknown",
            token_dir: Optional[str] = None) -> dict[str, Any]:
    """The rollout as one ATIF v1.7 document (a JSON object). Raises `ValueError` for a rollout
    with no readable call (ATIF has no empty trajectory)."""
    store = capture_store(captures, "to_atif")
    calls = read_model_call_records(store, rollout_id)
    tokens = {(record.call_index, record.choice_index): record
              for record in read_token_records(store, rollout_id, token_dir)}
    groups: dict[Optional[str], list[ModelCallRecord]] = {}
    for call in calls:
        groups.setdefault(_agent_of(call, calls), []).append(call)
    if not groups:
        raise ValueError(f"to_atif: rollout {rollout_id!r} has no readable call")
    main_agent = _agent_of(calls[0], calls)
    document = _trajectory(rollout_id, rollout_id, groups.pop(main_agent), tokens, agent_name, agent_version)
    end = read_rollout_end(store, rollout_id)
    if end is not None:
        document["extra"] = {key: value for key, value in
                             (("outcome", end.outcome), ("ended_at", end.ended_at), ("group", end.group)) if value is not None}
    if groups:
        document["subagent_trajectories"] = [
            _trajectory(rollout_id, f"{rollout_id}/{agent}", group, tokens, f"{agent_name}/{agent}", agent_version)
            for agent, group in groups.items()]
    return document


def _agent_of(call: ModelCallRecord, calls: list[ModelCallRecord]) -> Optional[str]:
    """The harness's agent of a call: None for the main agent (no parent named, or the first call's agent)."""
    if call.client_parent_agent_id is None or call.client_agent_id == calls[0].client_agent_id:
        return None
    return call.client_agent_id


def _trajectory(session: str, trajectory_id: str, calls: list[ModelCallRecord], tokens: dict[tuple[int, int], TokenRecord],
                agent_name: str, agent_version: str) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    seen = 0  # Request turns already stepped (the last reply counts as one).
    for call in calls:
        turns = _turns(call.request or {})
        for turn in turns[seen:]:
            _add_turn(steps, turn, copied=seen == 0)
        steps.append(_agent_step(len(steps) + 1, call, tokens.get((call.call_index, 0))))
        seen = len(turns) + 1
    for number, step in enumerate(steps, start=1):
        step["step_id"] = number
    agent_steps = [step for step in steps if step["source"] == "agent" and "metrics" in step]
    totals: dict[str, Any] = {"total_steps": len(steps)}
    for total, name in (("total_prompt_tokens", "prompt_tokens"), ("total_completion_tokens", "completion_tokens"),
                        ("total_cached_tokens", "cached_tokens")):
        values = [step["metrics"][name] for step in agent_steps if step["metrics"].get(name) is not None]
        if values:
            totals[total] = sum(values)
    model = next((call.model for call in calls if call.model), None)
    agent: dict[str, Any] = {"name": agent_name, "version": agent_version}
    if model is not None:
        agent["model_name"] = model
    return {"schema_version": ATIF_SCHEMA_VERSION, "session_id": session, "trajectory_id": trajectory_id,
            "agent": agent, "steps": steps, "final_metrics": totals}


def _add_turn(steps: list[dict[str, Any]], turn: dict[str, Any], copied: bool) -> None:
    role = turn["role"]
    if role == "tool":
        for earlier in reversed(steps):
            if earlier["source"] == "agent":
                ids = {call["tool_call_id"] for call in earlier.get("tool_calls") or ()}
                result: dict[str, Any] = {"content": turn["text"]}
                if turn.get("tool_call_id") in ids:
                    result["source_call_id"] = turn["tool_call_id"]
                earlier.setdefault("observation", {"results": []})["results"].append(result)
                return
        role = "user"  # A tool's result before any reply of the agent: said by the user, as far as ATIF goes.
    if role == "assistant":
        step: dict[str, Any] = {"step_id": 0, "source": "agent", "message": turn["text"], "is_copied_context": copied}
        if turn.get("tool_calls"):
            step["tool_calls"] = turn["tool_calls"]
        steps.append(step)
        return
    steps.append({"step_id": 0, "source": "system" if role in ("system", "developer") else "user", "message": turn["text"]})


def _agent_step(number: int, call: ModelCallRecord, record: Optional[TokenRecord]) -> dict[str, Any]:
    step: dict[str, Any] = {"step_id": number, "source": "agent", "message": _reply_text(call.response or {}),
                            "llm_call_count": 1}
    if call.started_at is not None:
        step["timestamp"] = datetime.fromtimestamp(call.started_at, tz=timezone.utc).isoformat().replace("+00:00", "Z")
    if call.model is not None:
        step["model_name"] = call.model
    if call.reasoning_content:
        step["reasoning_content"] = call.reasoning_content
    if call.tool_calls:
        step["tool_calls"] = [{"tool_call_id": str(tool.get("call_id") or f"call_{call.call_index}_{position}"),
                               "function_name": str(tool.get("name") or ""),
                               "arguments": tool["arguments"] if isinstance(tool.get("arguments"), dict)
                               else {"_raw": tool.get("arguments")}}
                              for position, tool in enumerate(call.tool_calls)]
    metrics: dict[str, Any] = {}
    for name, value in (("prompt_tokens", call.tokens_in), ("completion_tokens", call.tokens_out),
                        ("cached_tokens", call.cached_tokens)):
        if type(value) is int and value >= 0:
            metrics[name] = value
    if record is not None:
        if record.prompt_token_ids is not None:
            metrics["prompt_token_ids"] = record.prompt_token_ids
        if record.generation_token_ids is not None:
            metrics["completion_token_ids"] = record.generation_token_ids
        if record.generation_log_probs is not None:
            metrics["logprobs"] = record.generation_log_probs
    step["metrics"] = metrics
    extra = {"model_call_id": call.model_call_id, "call_index": call.call_index, "status_code": call.status_code,
             "error_category": call.error_category, "dialect": call.dialect}
    step["extra"] = {key: value for key, value in extra.items() if value is not None}
    return step


# -- the request's turns, whatever the dialect ---------------------------------------------------

def _turns(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's conversation as ``{role, text, tool_call_id?, tool_calls?}``: Chat and Anthropic
    ``messages`` (Anthropic's ``system`` first), Responses ``instructions`` and ``input``."""
    turns: list[dict[str, Any]] = []
    system = request.get("system")
    if system:
        turns.append({"role": "system", "text": _text(system)})
    instructions = request.get("instructions")
    if isinstance(instructions, str) and instructions:
        turns.append({"role": "system", "text": instructions})
    messages = request.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                turns.extend(_message_turns(message))
        return turns
    prompt = request.get("prompt")  # Completions: the prompt is the user's turn.
    if isinstance(prompt, str):
        turns.append({"role": "user", "text": prompt})
    items = request.get("input")
    if isinstance(items, str):
        turns.append({"role": "user", "text": items})
    elif isinstance(items, list):
        for item in items:
            if isinstance(item, dict):
                turns.extend(_item_turns(item))
    return turns


def _message_turns(message: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = str(message.get("role") or "user"), message.get("content")
    if role == "tool":
        return [{"role": "tool", "text": _text(content), "tool_call_id": message.get("tool_call_id")}]
    if isinstance(content, list) and any(isinstance(block, dict) and block.get("type") == "tool_result" for block in content):
        return [{"role": "tool", "text": _text(block.get("content")), "tool_call_id": block.get("tool_use_id")}
                for block in content if isinstance(block, dict) and block.get("type") == "tool_result"]
    turn: dict[str, Any] = {"role": role, "text": _text(content)}
    calls = [_tool_call(call.get("id"), (call.get("function") or {}).get("name"), (call.get("function") or {}).get("arguments"))
             for call in message.get("tool_calls") or () if isinstance(call, dict)]
    if isinstance(content, list):
        calls += [_tool_call(block.get("id"), block.get("name"), block.get("input"))
                  for block in content if isinstance(block, dict) and block.get("type") == "tool_use"]
    if calls:
        turn["tool_calls"] = calls
    return [turn]


def _item_turns(item: dict[str, Any]) -> list[dict[str, Any]]:
    kind = item.get("type")
    if kind == "function_call_output":
        return [{"role": "tool", "text": _text(item.get("output")), "tool_call_id": item.get("call_id")}]
    if kind == "function_call":
        return [{"role": "assistant", "text": "",
                 "tool_calls": [_tool_call(item.get("call_id"), item.get("name"), item.get("arguments"))]}]
    if kind in (None, "message"):
        return [{"role": str(item.get("role") or "user"), "text": _text(item.get("content"))}]
    return []  # Reasoning items and the like: the reply's step already says them.


def _tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = {"_raw": arguments}
    return {"tool_call_id": str(call_id or ""), "function_name": str(name or ""),
            "arguments": arguments if isinstance(arguments, dict) else {"_raw": arguments}}


def _text(content: Any) -> str:
    """Text of a message's content: a string, or its parts' text joined (images are not carried)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text(part.get("text") if isinstance(part, dict) and "text" in part else
                             part.get("content") if isinstance(part, dict) else part) for part in content)
    return "" if content is None else json.dumps(content, sort_keys=True, default=str)


def _reply_text(response: dict[str, Any]) -> str:
    """The reply's answer text: Chat's first choice, Responses' output messages, Anthropic's text blocks."""
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        message = choices[0].get("message")
        return _text(message.get("content")) if isinstance(message, dict) else str(choices[0].get("text") or "")
    output = response.get("output")
    if isinstance(output, list):
        return "".join(_text(item.get("content")) for item in output
                       if isinstance(item, dict) and item.get("type") == "message")
    content = response.get("content")
    if isinstance(content, list):
        return "".join(str(block.get("text") or "") for block in content if isinstance(block, dict) and block.get("type") == "text")
    return ""
