"""What the agent may do (issue 71, DESIGN section 17; docs/operations.md, "Who may change state"):
model calls and nothing else. An agent process that holds what the default deployment gives it
(the model port, its headers, a model API key) cannot end its rollout, change its outcome, end the
run, declare a weight version or reach a consumer's state; the runner, with the token, can."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from records import read_rollout_end
from records.contract import ObjectStore
from tests.processes import SidecarProcess

_AGENT = r'''
import json, sys, urllib.request, urllib.error
base, rollout_id = sys.argv[1], sys.argv[2]

def send(method, path, body=b"", headers=None):
    request = urllib.request.Request(base + path, data=body if method == "POST" else None, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code

call = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "hi"}]}).encode()
answers = {"model call": send("POST", f"/ng-rollout/{rollout_id}/v1/chat/completions", call,
                              {"Authorization": "Bearer sk-agent-model-key"})}
reward = json.dumps({"outcome": {"reward": 1.0}}).encode()
for name, headers in {"bare": {}, "its model key": {"Authorization": "Bearer sk-agent-model-key"},
                      "x-api-key": {"x-api-key": "sk-agent-model-key"}, "basic": {"Authorization": "Basic YTpi"}}.items():
    answers[f"end ({name})"] = send("POST", f"/-/rollouts/{rollout_id}/end", reward, headers)
    answers[f"run end ({name})"] = send("POST", "/-/run/end", b"{}", headers)
    answers[f"weight version ({name})"] = send("POST", "/-/weight-version", b'{"version": "agent"}', headers)
answers["end under its prefix"] = send("POST", f"/ng-rollout/{rollout_id}/-/rollouts/{rollout_id}/end", reward)
answers["a typo'd admin path"] = send("POST", f"/-/rollout/{rollout_id}/end", reward)
for verb in ("take", "ack", "commit"):
    answers[f"consumer {verb}"] = send("POST", f"/-/consumers/trainer/{verb}", b"{}")
print(json.dumps(answers))
'''


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["directory", "store"])
@pytest.mark.parametrize("token", ["runner-secret-token", None])
def test_an_agent_cannot_end_its_rollout_or_touch_the_trainers_state_and_the_runner_can(tmp_path, layout, token):
    where = (["--capture-dir", str(tmp_path / "captures")] if layout == "directory" else
             ["--capture-dir", str(tmp_path / "spool"), "--capture-store", f"segments://{tmp_path / 'store'}",
              "--segment-max-age", "0.2"])
    sidecar = SidecarProcess.start("--stand-in", *where, env={"MCC_ADMIN_TOKEN": token} if token else None)
    try:
        agent = subprocess.run([sys.executable, "-c", _AGENT, sidecar.url, "task-0"], capture_output=True, text=True,
                               timeout=120, env={"PATH": "/usr/bin:/bin"})  # Not the runner's environment.
        assert agent.returncode == 0, agent.stderr
        answers = orjson.loads(agent.stdout)
        assert answers.pop("model call") == 200, "the agent may make model calls"
        for attempt, status in answers.items():
            assert status in (401, 403, 404, 405), f"{attempt}: {status}"
        captures = str(tmp_path / "captures") if layout == "directory" else f"segments://{tmp_path / 'store'}"
        assert read_rollout_end(captures, "task-0") is None, "no end, no reward"
        if layout == "directory":
            assert not (tmp_path / "captures" / "run").exists() and not (tmp_path / "captures" / "consumers").exists()
        else:
            assert ObjectStore(captures).get_if_present("run/end.json") is None
        # The runner can: with the token over HTTP, and from the captures without one.
        import urllib.request

        if token is not None:
            request = urllib.request.Request(f"{sidecar.url}/-/rollouts/task-0/end", method="POST",
                                             data=b'{"outcome": {"reward": 0.25}}',
                                             headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, timeout=30) as reply:
                assert reply.status == 200
        else:
            from records import end_rollout

            end_rollout(captures, "task-0", outcome={"reward": 0.25})
        assert read_rollout_end(captures, "task-0").outcome == {"reward": 0.25}
        again = subprocess.run([sys.executable, "-c", _AGENT, sidecar.url, "task-0"], capture_output=True, text=True,
                               timeout=120, env={"PATH": "/usr/bin:/bin"})
        assert read_rollout_end(captures, "task-0").outcome == {"reward": 0.25}, "the outcome stays the runner's"
        if layout == "directory" or token is not None:  # (A store's end reaches the sidecar at its next listing.)
            assert orjson.loads(again.stdout)["model call"] == 409, "an ended rollout takes no more calls"
    finally:
        assert sidecar.terminate() == 0
    assert token is None or not any(token in line for line in sidecar.stderr_lines), "the token is never logged"


def test_a_token_on_the_command_line_is_refused_and_a_token_file_works(tmp_path):
    from click.testing import CliRunner

    from proxy import main

    said = CliRunner().invoke(main, ["serve", "--stand-in", "--admin-token", "s3cret"], prog_name="mcc")
    assert said.exit_code == 2 and "shows in ps" in said.output and "MCC_ADMIN_TOKEN" in said.output
    token_file = tmp_path / "admin-token"
    token_file.write_text("from-a-file\n")
    sidecar = SidecarProcess.start("--stand-in", "--capture-dir", str(tmp_path / "c"), "--admin-token-file",
                                   str(token_file))
    try:
        import urllib.error
        import urllib.request

        with open(f"/proc/{sidecar.process.pid}/cmdline", "rb") as handle:
            assert b"from-a-file" not in handle.read(), "ps shows the file's path, never the token"
        (tmp_path / "c" / "r1.capture.jsonl").write_bytes(b"")  # (a rollout that made a call)
        for headers, expected in (({}, 401), ({"Authorization": "Bearer from-a-file"}, 200)):
            request = urllib.request.Request(f"{sidecar.url}/-/rollouts/r1/end", method="POST", data=b"",
                                             headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    status = reply.status
            except urllib.error.HTTPError as error:
                status = error.code
            assert status == expected
    finally:
        assert sidecar.terminate() == 0
