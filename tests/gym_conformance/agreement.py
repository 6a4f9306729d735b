"""NeMo Gym 0.7.0's reader beside `records`, field by field: shared by the recordings'
conformance suite (`test_gym_agrees.py`) and the end-to-end collection (`tests/gym_e2e`).

`run_gym` runs `gym_reader.py` in Gym's venv; `compare_rollout` compares what it read of one
rollout with what `records` reads, allowing only the differences a seed rule explains
(`SEED_RULES`), each checked to be exactly that rule's effect.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Callable, Optional

from records import CaptureStore, aggregate_model_call_records, read_model_call_records

GYM_READER = os.path.join(os.path.dirname(__file__), "gym_reader.py")


def run_gym(gym: str, *args: str) -> Any:
    done = subprocess.run([gym, GYM_READER, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _usage(line: dict[str, Any]) -> dict[str, Any]:
    response = line.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    return usage if isinstance(usage, dict) else {}


def _prompt_tokens_beside_other_counts(line: dict[str, Any], gym_value: Any, ours: Any) -> bool:
    """docs/records.md: `prompt_tokens` wins whenever present, even beside Anthropic cache fields or
    `input_tokens` a gateway added; Gym takes `input_tokens` first and adds the cache fields."""
    usage = _usage(line)
    return isinstance(usage.get("prompt_tokens"), int) and ours == usage["prompt_tokens"] and (
        "input_tokens" in usage or "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage)


def _custom_tool_calls(line: dict[str, Any], gym_value: Any, ours: Any) -> bool:
    """The seed lists `custom_tool_call` items as tool calls; Gym reads only `function_call`."""
    output = (line.get("response") or {}).get("output") or []
    custom = [item for item in output if isinstance(item, dict) and item.get("type") == "custom_tool_call"]
    return bool(custom) and [c for c in ours if c["call_id"] not in {i.get("call_id") for i in custom}] == gym_value


def _reasoning_text_content(line: dict[str, Any], gym_value: Any, ours: Any) -> bool:
    """docs/records.md: Responses reasoning comes from summaries *and* `reasoning_text` content; Gym reads summaries only."""
    output = (line.get("response") or {}).get("output") or []
    texts = [part.get("text") for item in output if isinstance(item, dict) and item.get("type") == "reasoning"
             for part in (item.get("content") or []) if isinstance(part, dict) and part.get("text")]
    return bool(texts) and isinstance(ours, str) and all(text in ours for text in texts) and (
        gym_value is None or gym_value in ours)


#: field -> the seed rule that may make ours differ from Gym's, as a check of that exact effect.
SEED_RULES: dict[str, Callable[[dict[str, Any], Any, Any], bool]] = {
    "tokens_in": _prompt_tokens_beside_other_counts,
    "tokens_total": lambda line, gym_value, ours: _prompt_tokens_beside_other_counts(line, None, _usage(line).get("prompt_tokens"))
    and "total_tokens" not in _usage(line),
    "tool_calls": _custom_tool_calls,
    "reasoning_content": _reasoning_text_content,
}


def _disagreements(rollout_id: str, gym_record: dict[str, Any], ours: dict[str, Any],
                   line: Optional[dict[str, Any]]) -> tuple[int, list[tuple[str, str, Any, Any]], list[str]]:
    compared, unexplained, by_rule = 0, [], []
    for field, gym_value in gym_record.items():
        compared += 1
        if ours.get(field) == gym_value:
            continue
        rule = SEED_RULES.get(field)
        if rule is not None and line is not None and rule(line, gym_value, ours.get(field)):
            by_rule.append(f"{rollout_id}.{field}")
            continue
        unexplained.append((rollout_id, field, gym_value, ours.get(field)))
    return compared, unexplained, by_rule


def compare_rollout(store: CaptureStore, rollout_id: str, gym: dict[str, Any]) -> tuple[int, list, list]:
    from records import merge_model_call_capture_into_record
    compared, unexplained, by_rule = 0, [], []
    lines = store.read_available(rollout_id).lines
    ours = read_model_call_records(store, rollout_id)
    assert len(ours) == len(gym["records"]), rollout_id
    assert store.read_available(rollout_id).malformed == gym["unreadable"], rollout_id
    for line, record, gym_record in zip(lines, ours, gym["records"]):
        counts = _disagreements(rollout_id, gym_record, record.model_dump(mode="json"), line)
        compared, unexplained, by_rule = compared + counts[0], unexplained + counts[1], by_rule + counts[2]
    if "raises" not in gym["metrics"]:
        assert gym["strict"] == len(ours), rollout_id
    # Gym's strict readers raise on a torn line, where ours (tolerant by default, docs/files.md)
    # skip it: compared only where Gym's did not raise.
    metrics = aggregate_model_call_records(ours)
    gym_metrics = gym["metrics"] if "raises" not in gym["metrics"] else merged_metrics(gym)
    for key, gym_value in gym_metrics.items():
        compared += 1
        if metrics.get(key) != gym_value and not any(entry == f"{rollout_id}.{key}" for entry in by_rule):
            unexplained.append((rollout_id, f"metrics.{key}", gym_value, metrics.get(key)))
    merged = merge_model_call_capture_into_record({"_ng_rollout_id": rollout_id}, [store.capture_dir])
    attachment = merged["ng_model_call_capture"]
    for key in ("rollout_id", "gaps"):
        compared += 1
        if attachment.get(key) != gym["merged"].get(key):
            unexplained.append((rollout_id, f"merged.{key}", gym["merged"].get(key), attachment.get(key)))
    compared += 1
    if list(attachment["metrics"]) != list(gym["merged"]["metrics"]):  # Gym's shape, by default (issue 23).
        unexplained.append((rollout_id, "merged.metrics keys", list(gym["merged"]["metrics"]), list(attachment["metrics"])))
    for ours_call, gym_call in zip(attachment["calls"], gym["merged"]["calls"], strict=True):
        compared += 1
        if set(gym_call) != set(ours_call):
            unexplained.append((rollout_id, "merged.calls keys", sorted(set(gym_call) ^ set(ours_call)), None))
    return compared, unexplained, by_rule


def merged_metrics(gym: dict[str, Any]) -> dict[str, Any]:
    """Gym's collector's metrics (its tolerant path), where its strict `aggregate_model_call_metrics` raised."""
    return gym["merged"]["metrics"]


