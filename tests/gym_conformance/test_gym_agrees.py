"""NeMo Gym 0.7.0's own reader and `records` agree on what the real sidecar captured (issue 14).

Every recorded body under ../shared/fixtures is served by a scripted upstream, sent through the
real sidecar, and captured; then Gym's `read_model_call_records`, `aggregate_model_call_metrics`
and `merge_model_call_capture_into_record` run over the capture directory in Gym's own venv
(`gym_venv.py`), and every field of every Gym record is compared with ours. The only differences
allowed are where the seed states a rule Gym does not follow (`SEED_RULES`), each checked to be
exactly that rule's effect.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Callable, Optional

import pytest

from records import CaptureStore, aggregate_model_call_records, read_model_call_records
from tests.conformance.fixtures import FIXTURES, requires_fixtures
from tests.conformance.test_recorded_through_proxy import _script
from tests.wire import fetch, rollout_url

from .gym_venv import GymUnavailable, gym_python

pytestmark = [pytest.mark.conformance, requires_fixtures]

GYM_READER = os.path.join(os.path.dirname(__file__), "gym_reader.py")
GYM_CONFIG = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "gym", "gym_config.yaml"))


@pytest.fixture(scope="module")
def gym() -> str:
    try:
        return gym_python()
    except GymUnavailable as exc:
        pytest.skip(f"NeMo Gym's reader is not available here: {exc}")


def run_gym(gym: str, *args: str) -> Any:
    done = subprocess.run([gym, GYM_READER, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _usage(line: dict[str, Any]) -> dict[str, Any]:
    response = line.get("response")
    usage = response.get("usage") if isinstance(response, dict) else None
    return usage if isinstance(usage, dict) else {}


def _prompt_tokens_beside_other_counts(line: dict[str, Any], gym_value: Any, ours: Any) -> bool:
    """DESIGN §7: `prompt_tokens` wins whenever present, even beside Anthropic cache fields or
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
    """DESIGN §7: Responses reasoning comes from summaries *and* `reasoning_text` content; Gym reads summaries only."""
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


async def test_records_agree_with_gyms_reader_field_by_field(http, upstream, sidecar, capture_dir, gym, tmp_path):
    rollout_ids = []
    for fixture in FIXTURES:
        upstream.scripts[fixture.path] = _script(fixture, [fixture.body])
        rollout_id = f"fx-{fixture.name}"
        await fetch(http, "POST", rollout_url(sidecar.url, rollout_id, fixture.path), fixture.request or b'{"model": "m"}')
        rollout_ids.append(rollout_id)
    # The attachment's gaps, beside the sidecar's own files: a torn last line, a marker alone.
    gaps_dir = tmp_path / "gaps"
    gaps_dir.mkdir()
    first_line = open(CaptureStore(capture_dir).path_for(rollout_ids[0]), "rb").read()
    (gaps_dir / "gap-torn.capture.jsonl").write_bytes(first_line + first_line + b'{"torn')
    (gaps_dir / "gap-marker-only.capture.incomplete").write_bytes(b"")
    (gaps_dir / "gap-incomplete.capture.jsonl").write_bytes(first_line)
    (gaps_dir / "gap-incomplete.capture.incomplete").write_bytes(b"")
    directories = {capture_dir: rollout_ids, str(gaps_dir): ["gap-torn", "gap-marker-only", "gap-incomplete", "gap-none"]}

    compared, unexplained, by_rule = 0, [], []
    for directory, ids in directories.items():
        theirs = run_gym(gym, directory, *ids)
        for rollout_id in ids:
            counts = _compare_rollout(CaptureStore(directory), rollout_id, theirs[rollout_id])
            compared, unexplained, by_rule = compared + counts[0], unexplained + counts[1], by_rule + counts[2]
    print(f"\nGym 0.7.0 vs records: {sum(map(len, directories.values()))} rollouts, {compared} fields compared, "
          f"{len(by_rule)} differences by a seed rule ({sorted({e.split('.')[-1] for e in by_rule})}), "
          f"{len(unexplained)} unexplained")
    assert unexplained == []


def _compare_rollout(store: CaptureStore, rollout_id: str, gym: dict[str, Any]) -> tuple[int, list, list]:
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
    # Gym's strict readers raise on a torn line, where ours (tolerant by default, DESIGN §3)
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
    for ours_call, gym_call in zip(attachment["calls"], gym["merged"]["calls"], strict=True):
        compared += 1
        if set(gym_call) - set(ours_call):
            unexplained.append((rollout_id, "merged.calls keys", sorted(set(gym_call) - set(ours_call)), None))
    return compared, unexplained, by_rule


def merged_metrics(gym: dict[str, Any]) -> dict[str, Any]:
    """Gym's collector's metrics (its tolerant path), where its strict `aggregate_model_call_metrics` raised."""
    return gym["merged"]["metrics"]


def test_gyms_config_loader_accepts_deploy_gym(gym):
    loaded = run_gym(gym, "--load-config", GYM_CONFIG)
    assert loaded["capture_dirs"] == ["/data/model-calls"]
    assert loaded["config"]["mcc_base_url"] == "http://127.0.0.1:8080/v1"
    assert loaded["config"]["policy_model"]["responses_api_models"]["vllm_model"]["base_url"] == "http://127.0.0.1:8000/v1"
