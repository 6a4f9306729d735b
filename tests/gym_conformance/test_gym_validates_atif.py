"""`records.to_atif`'s documents are valid under NeMo Gym 0.7.0's own strict ATIF v1.7 models
(``nemo_gym.atif_v1_7.AtifTrajectoryV1_7``, which reject unknown structural fields), in its venv:
every dialect's tool-calling turn, token-mode rollouts with their arrays, and a sub-agent's
trajectory (validated as a document of its own)."""

from __future__ import annotations

import json
import subprocess

from records import end_rollout, to_atif

from tests.records.training.atif_runs import make_atif_dir

_GYM_SCRIPT = r"""
import json, sys
from nemo_gym.atif_v1_7 import AtifTrajectoryV1_7

verdicts = {}
for line in sys.stdin:
    document = json.loads(line)
    try:
        AtifTrajectoryV1_7.model_validate(document)
        for sub in document.get("subagent_trajectories") or ():
            AtifTrajectoryV1_7.model_validate(sub)
        verdicts[document["session_id"]] = "valid"
    except Exception as exc:
        verdicts[document["session_id"]] = f"{type(exc).__name__}: {exc}"
print(json.dumps(verdicts))
"""


def test_every_document_is_valid_under_gyms_atif_models(gym, tmp_path):
    ids = make_atif_dir(str(tmp_path))
    end_rollout(str(tmp_path), ids[0], outcome={"reward": 1.0, "metrics": {"passed": 3}})  # Its outcome: the root's extra.
    documents = [to_atif(str(tmp_path), rollout_id) for rollout_id in ids]
    assert any(document.get("subagent_trajectories") for document in documents)
    assert documents[0]["extra"]["outcome"] == {"reward": 1.0, "metrics": {"passed": 3}}
    done = subprocess.run([gym, "-c", _GYM_SCRIPT], input="".join(json.dumps(d) + "\n" for d in documents),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {rollout_id: "valid" for rollout_id in ids}
