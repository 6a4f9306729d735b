"""`make gym-e2e`: a real NeMo Gym 0.7.0 rollout collection through the sidecar (issue 23).

The stand-in model, the sidecar and Gym's servers are started from ``deploy/gym`` with the
commands of ``deploy/gym/README.md``, read from it as written (only the ports, the capture
directory, the venv directory and where Gym's run logs go are overridden, the way its
"Overrides" table says: nothing is written into this checkout). Gym collects
4 tasks x 4 repeats; when the fourth call is on disk the sidecar is killed with SIGKILL, calls in
flight; Gym routes the failed rollouts to its failures file; the sidecar is started again and the
collection resumed, as the README says. Then:

- every row's calls are captured under Gym's rollout id, the retried ones as ``-a<n>``, and every
  reply an agent received is on disk (the kill lost nothing acknowledged);
- Gym's own reader and `records` agree field by field on every file, and Gym's reader accepts a
  `records.CaptureStore`;
- the capture Gym attached to each row is what `records` reads from the files, in Gym's shape.

NeMo Gym runs from its cached venv (`tests/gym_conformance/gym_venv.py`: Python 3.13, about 90 s
and 1.4 GB the first time); this checkout is installed into it for the agent server, as the
README's "Install" does. Ray stays on loopback (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``). Where
Gym cannot be installed the tests skip with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

from records import CaptureStore, merge_model_call_capture_into_record
from tests.capture_dirs import rollout_files
from tests.gym_conformance.agreement import compare_rollout, run_gym
from tests.gym_conformance.gym_venv import GymUnavailable, gym_python

pytestmark = [pytest.mark.gym_e2e, pytest.mark.timeout(1800)]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GYM_DIR = os.path.join(ROOT, "deploy", "gym")
README = os.path.join(GYM_DIR, "README.md")
TASKS, REPEATS = 4, 4
with open(os.path.join(GYM_DIR, "data", "example.jsonl"), encoding="utf-8") as _tasks:
    TASK_PARAMS = [json.loads(line)["responses_create_params"] for line in _tasks if line.strip()]


def readme_command(starts: str) -> list[str]:
    """The README's command line that starts with ``starts``, split as the shell would."""
    with open(README, encoding="utf-8") as handle:
        lines = [line.strip() for line in handle if line.strip().startswith(starts)]
    assert lines, f"deploy/gym/README.md has no command starting {starts!r}"
    return shlex.split(lines[0].replace("$HOME", "HOME_DIR"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Services:
    """The processes of one collection, each in a session of its own so all its children stop with it."""

    env: dict[str, str]
    logs: str
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, command: list[str]) -> subprocess.Popen:
        log = open(os.path.join(self.logs, f"{name}.log"), "ab")
        process = subprocess.Popen(command, cwd=GYM_DIR, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self.processes[name] = process
        return process

    def log(self, name: str) -> str:
        with open(os.path.join(self.logs, f"{name}.log"), encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
        process = self.processes.pop(name)
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        _kill_session(process.pid)  # Ray's workers and Gym's servers, whatever is left of the session.
        process.wait(10)

    def stop_all(self) -> None:
        for name in list(self.processes):
            self.stop(name, signal.SIGINT)


def _kill_session(session: int) -> None:
    listed = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout.split("\n")
    for line in listed:
        parts = line.split()
        if len(parts) == 2 and int(parts[1]) == session:
            try:
                os.kill(int(parts[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_until(check: Any, what: str, timeout: float, services: Services, log: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:.0f} s; {log}.log ends:\n{services.log(log)[-3000:]}")
        time.sleep(0.2)


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Collection:
    capture_dir: str
    rows: list[dict[str, Any]]
    first_pass_rows: list[dict[str, Any]]
    failures: list[dict[str, Any]]
    files_at_kill: list[str]
    gym_python: str
    #: (the README's command, as run; what was added after it)
    commands: list[tuple[list[str], list[str]]]
    #: What the resumed collection printed (Gym's rollout-health report is in it).
    health: str = ""


def _jsonl(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _complete_lines(path: str) -> int:
    """Rows a writer has ended so far (its last may be half written)."""
    try:
        with open(path, "rb") as handle:
            return handle.read().count(b"\n")
    except FileNotFoundError:
        return 0


@pytest.fixture(scope="module")
def collection(tmp_path_factory) -> Iterator[Collection]:
    try:
        python = gym_python()
    except GymUnavailable as exc:
        pytest.skip(f"NeMo Gym 0.7.0 cannot be installed here: {exc}")
    venv = os.path.dirname(os.path.dirname(python))
    done = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
                           "--force-reinstall", ROOT], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"installing this checkout into Gym's venv failed: {done.stderr[-2000:]}"
    work = tmp_path_factory.mktemp("gym-e2e")
    capture_dir, venvs, logs = str(work / "model-calls"), str(work / "gym-venvs"), str(work / "logs")
    os.makedirs(capture_dir)
    os.makedirs(logs)
    subprocess.run([os.path.join(GYM_DIR, "link_venvs.sh"), venv, venvs], check=True, capture_output=True)
    model, sidecar, head = free_port(), free_port(), free_port()
    # mcc from this project's environment (the sidecar's), gym from Gym's venv.
    env = {**os.environ, "PATH": f"{os.path.dirname(_mcc())}:{os.path.join(venv, 'bin')}:{os.environ.get('PATH', '')}",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONUNBUFFERED": "1"}
    env.pop("VIRTUAL_ENV", None)
    services = Services(env, logs)
    gym_overrides = [f"++model_call_capture_dir={capture_dir}", f"++policy_base_url=http://127.0.0.1:{model}/v1",
                     f"++mcc_base_url=http://127.0.0.1:{sidecar}/v1", f"+head_server.port={head}",
                     f"hydra.run.dir={work / 'hydra'}"]  # Gym's run logs, not in this checkout.

    commands: list[tuple[list[str], list[str]]] = []

    def readme(starts: str, *overrides: str) -> list[str]:
        """The README's command, its own paths made this run's, and the overrides added after it."""
        command = ["+uv_venv_dir=" + venvs if word.startswith("+uv_venv_dir=") else
                   str(work / "rollouts.jsonl") if word == "rollouts.jsonl" else word for word in readme_command(starts)]
        commands.append((command, list(overrides)))
        return command + list(overrides)

    # A generation's time: calls are in flight when the sidecar is killed.
    stand_in = readme("mcc stand-in", "--port", str(model), "--delay", "0.5")
    serve = readme("mcc serve --config", "--capture-dir", capture_dir, "--port", str(sidecar),
                   "--upstream", f"http://127.0.0.1:{model}")
    servers = readme("gym env start", *gym_overrides)
    collect = readme("gym eval run --no-serve --config", *gym_overrides)
    resume = readme("gym eval run --no-serve --resume", *gym_overrides)
    for command in (collect, resume):  # 4 repeats, not the README's 2: more rollouts for the kill to cut.
        command += ["--num-repeats", str(REPEATS), "--concurrency", "4"]
    try:
        services.start("stand-in", stand_in)
        services.start("sidecar", serve)
        wait_until(lambda: listening(model) and listening(sidecar), "the stand-in and the sidecar listen", 60,
                   services, "sidecar")
        services.start("gym-servers", servers)
        wait_until(lambda: "servers ready!" in services.log("gym-servers"), "Gym's servers are ready", 600,
                   services, "gym-servers")
        collecting = services.start("collect", collect)
        # Killed once a rollout has its row, not merely its line: a line is durable before its reply is
        # released, so a kill at the fourth line could still cut all four replies (a CI run lost every one).
        wait_until(lambda: (len(rollout_files(capture_dir)) >= 4 and _complete_lines(str(work / "rollouts.jsonl")) >= 1)
                   or collecting.poll() is not None,
                   "four rollouts' calls are on disk and one rollout has its row", 300, services, "collect")
        services.stop("sidecar", signal.SIGKILL)  # Mid-collection, calls in flight.
        files_at_kill = rollout_files(capture_dir)
        assert collecting.wait(300) == 0, services.log("collect")[-3000:]
        services.processes.pop("collect")
        first_pass_rows = _jsonl(str(work / "rollouts.jsonl"))
        services.start("sidecar", serve)
        wait_until(lambda: listening(sidecar), "the sidecar listens again", 60, services, "sidecar")
        resuming = services.start("resume", resume)
        assert resuming.wait(300) == 0, services.log("resume")[-3000:]
        services.processes.pop("resume")
        yield Collection(capture_dir, _jsonl(str(work / "rollouts.jsonl")), first_pass_rows,
                         _jsonl(str(work / "rollouts_failures.jsonl")), files_at_kill, python, commands,
                         services.log("resume"))
    finally:
        services.stop_all()


def _mcc() -> str:
    import shutil
    import sys
    return shutil.which("mcc", path=os.path.dirname(sys.executable)) or "mcc"


def _rollout_id(row: dict[str, Any]) -> str:
    base = f"{row['_ng_task_index']}-{row['_ng_rollout_index']}"
    attempt = row.get("_ng_attempt_index") or 0
    return f"{base}-a{attempt}" if attempt else base


def test_every_rollout_is_collected_and_every_call_captured_under_gyms_rollout_id(collection):
    rows = collection.rows
    assert len(rows) == TASKS * REPEATS, f"{len(rows)} rows; failures: {collection.failures}"
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rows) == [
        (t, r) for t in range(TASKS) for r in range(REPEATS)]
    store = CaptureStore(collection.capture_dir)
    for row in rows:
        rollout_id = _rollout_id(row)
        attached = row["ng_model_call_capture"]
        assert attached["rollout_id"] == rollout_id and "gaps" not in attached, attached
        lines = store.read_available(rollout_id)
        assert len(lines.lines) == 1 and lines.malformed == 0, rollout_id
        line = lines.lines[0]
        assert line["response"]["id"] == row["response"]["id"], "the reply the agent got is the one on disk"
        assert line["status_code"] == 200 and line["error_category"] is None
        # The harness sent only what the task set: no null Gym's models would add.
        assert line["request"] == {**TASK_PARAMS[row["_ng_task_index"]], "model": "policy"}


def test_a_sidecar_killed_mid_collection_loses_nothing_acknowledged_and_retries_are_attempts(collection):
    assert 4 <= len(collection.files_at_kill) < TASKS * REPEATS, collection.files_at_kill
    first = {_rollout_id(row) for row in collection.first_pass_rows}
    assert first and len(first) < TASKS * REPEATS, "the kill cut the first pass short"
    retried = [row for row in collection.rows if row.get("_ng_attempt_index")]
    assert retried and {_rollout_id(row) for row in retried}.isdisjoint(first)
    assert all(_rollout_id(row).endswith(f"-a{row['_ng_attempt_index']}") for row in retried)
    failed = {_rollout_id(row) for row in collection.failures}
    assert failed and failed.isdisjoint(first), "the rollouts the kill failed were routed to Gym's failures file"
    # Every reply acknowledged before the kill kept its row and its line through the resume.
    store = CaptureStore(collection.capture_dir)
    for row in collection.first_pass_rows:
        assert store.read_available(_rollout_id(row)).lines[0]["response"]["id"] == row["response"]["id"]
    assert {_rollout_id(row) for row in collection.rows} <= set(store.rollout_ids())


def test_gyms_reader_and_records_agree_field_by_field(collection):
    store = CaptureStore(collection.capture_dir)
    ids = store.rollout_ids()
    theirs = run_gym(collection.gym_python, collection.capture_dir, *ids)
    compared, unexplained = 0, []
    for rollout_id in ids:
        counts = compare_rollout(store, rollout_id, theirs[rollout_id])
        compared, unexplained = compared + counts[0], unexplained + counts[1]
    assert compared > 100 and unexplained == []
    # Gym's own reader, handed a records.CaptureStore, reads the same records.
    through_records = run_gym(collection.gym_python, "--records-store", collection.capture_dir, *ids)
    for rollout_id in ids:
        assert through_records[rollout_id]["records"] == theirs[rollout_id]["records"]
        assert through_records[rollout_id]["unreadable"] == theirs[rollout_id]["unreadable"] == 0


def test_the_capture_gym_attached_is_what_records_reads_in_gyms_shape(collection):
    for row in collection.rows:
        attached = row["ng_model_call_capture"]
        bare = {key: value for key, value in row.items() if key != "ng_model_call_capture"}
        ours = merge_model_call_capture_into_record(bare, [collection.capture_dir])["ng_model_call_capture"]
        assert ours["rollout_id"] == attached["rollout_id"]
        assert ours["metrics"] == attached["metrics"], "the same metrics, in Gym's shape"
        assert [set(call) for call in ours["calls"]] == [set(call) for call in attached["calls"]], "Gym's keys"
        for mine, gyms in zip(ours["calls"], attached["calls"], strict=True):
            for key in ("model_call_id", "response_id", "call_index", "status_code", "tokens_in", "tokens_out",
                        "cached_tokens", "dialect", "model", "latency_total_ms", "started_at"):
                assert mine[key] == gyms[key], (row["_ng_task_index"], key)


def test_the_commands_run_are_the_readmes(collection):
    """Each command is the README's, as written, with only the overrides its table lists added after it
    (a later flag wins: the stand-in's and the collection's repeats are the test's own)."""
    allowed = ("++model_call_capture_dir=", "++policy_base_url=", "++mcc_base_url=", "+head_server.port=",
               "--capture-dir", "--port", "--upstream", "--delay", "--concurrency", "--num-repeats")
    assert len(collection.commands) == 5
    for command, added in collection.commands:
        assert command[0] in ("mcc", "gym")
        flags = [word for word in added if word.startswith(("+", "-"))]
        assert all(word.startswith(allowed) for word in flags), added


def test_each_row_has_gyms_trajectory_with_the_agents_turn(collection):
    """Issue 33, point 6: the SDK agent reports its invocation (``ng_agent_observations``; its calls
    carry the invocation's id in ``x-session-id``), so Gym's ``ng_trajectory`` has the turn and the
    conversation its rollout-health checks read, instead of marking the rollout unobserved."""
    for row in collection.rows:
        trajectory = row["ng_trajectory"]
        codes = {gap["code"] for gap in trajectory.get("gaps") or ()}
        assert not codes & {"turns_unavailable", "conversation_unavailable", "model_calls_unavailable",
                            "agent_observations_invalid", "agent_observation_join_failed"}, codes
        (invocation,) = trajectory["invocations"]
        assert invocation["status"] == "completed" and len(invocation["conversation"]) >= 2
        (turn,) = trajectory["turns"]
        (call,) = trajectory["model_calls"]
        assert [ref["model_call_id"] for ref in turn["model_calls"]] == [call["model_call_id"]]
        assert call["response"]["id"] == row["response"]["id"]
    unobserved = re.findall(r"(\d+) unobserved", collection.health)
    assert unobserved and int(unobserved[-1]) == 0, collection.health
