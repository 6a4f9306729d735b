"""NeMo Gym 0.7.0's own reader and `records` agree on what the real sidecar captured (issue 14).

Every recorded body under ../shared/fixtures is served by a scripted upstream, sent through the
real sidecar, and captured; then Gym's `read_model_call_records`, `aggregate_model_call_metrics`
and `merge_model_call_capture_into_record` run over the capture directory in Gym's own venv
(`gym_venv.py`), and every field of every Gym record is compared with ours. The only differences
allowed are where the seed states a rule Gym does not follow (`SEED_RULES`), each checked to be
exactly that rule's effect.
"""

from __future__ import annotations

import os

import pytest

from records import CaptureStore
from tests.conformance.fixtures import FIXTURES, requires_fixtures
from tests.conformance.test_recorded_through_proxy import _script
from tests.wire import fetch, rollout_url

from .agreement import compare_rollout, run_gym

pytestmark = [pytest.mark.conformance, requires_fixtures]

GYM_CONFIG = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "gym", "gym_config.yaml"))



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
            counts = compare_rollout(CaptureStore(directory), rollout_id, theirs[rollout_id])
            compared, unexplained, by_rule = compared + counts[0], unexplained + counts[1], by_rule + counts[2]
    print(f"\nGym 0.7.0 vs records: {sum(map(len, directories.values()))} rollouts, {compared} fields compared, "
          f"{len(by_rule)} differences by a seed rule ({sorted({e.split('.')[-1] for e in by_rule})}), "
          f"{len(unexplained)} unexplained")
    assert unexplained == []


def test_gyms_config_loader_accepts_deploy_gym(gym):
    loaded = run_gym(gym, "--load-config", GYM_CONFIG)
    assert loaded["capture_dirs"] == ["/data/model-calls"]
    assert loaded["config"]["mcc_base_url"] == "http://127.0.0.1:8080/v1"
    assert loaded["config"]["policy_model"]["responses_api_models"]["vllm_model"]["base_url"] == "http://127.0.0.1:8000/v1"
