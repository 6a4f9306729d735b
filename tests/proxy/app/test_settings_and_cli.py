"""Configuration (docs/configuration.md) and the `mcc serve` command as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import time
import sys
import urllib.request

import pytest

from proxy import ConfigError, load_settings
from records import CaptureStore

from tests.processes import post_chat, read_line

MCC = [sys.executable, "-m", "proxy"]


def test_defaults_leave_capture_off():
    settings = load_settings({"upstream": "http://127.0.0.1:8000"}, environ={})
    assert (settings.host, settings.port, settings.capture_on) == ("127.0.0.1", 8080, False)
    assert settings.max_body_bytes == 256 * 1024 * 1024
    assert settings.model_ref_name == "127.0.0.1:8000"


def test_precedence_is_defaults_yaml_env_cli(tmp_path):
    """A CLI flag beats MCC_* which beats the YAML file which beats the default."""
    config = tmp_path / "c.yaml"
    config.write_text("mcc:\n  port: 1111\n  host: 0.0.0.0\n  model-name: from-yaml\n")
    environ = {"MCC_PORT": "2222", "MCC_MODEL_NAME": "from-env", "MCC_UPSTREAM": "http://up:9"}
    settings = load_settings({"config": str(config), "port": 3333}, environ=environ)
    assert (settings.port, settings.host, settings.model_name, settings.upstream) == (3333, "0.0.0.0", "from-env", "http://up:9")


def test_nemo_gym_global_config_is_honoured(tmp_path):
    """observability_enabled + model_call_capture_dir turn capture on; other Gym keys are ignored."""
    config = tmp_path / "gym.yaml"
    config.write_text("observability_enabled: true\nmodel_call_capture_dir: /data/model-calls\n"
                      "policy_model:\n  responses_api_models:\n    vllm_model:\n      entrypoint: app.py\n")
    settings = load_settings({"config": str(config), "upstream": "http://vllm:8000"}, environ={})
    assert settings.capture_on and settings.capture_dir == "/data/model-calls"


def test_env_can_point_at_the_config_file(tmp_path):
    config = tmp_path / "gym.yaml"
    config.write_text("observability_enabled: false\nmodel_call_capture_dir: /data/x\n")
    settings = load_settings({"upstream": "http://u:1"}, environ={"MCC_CONFIG": str(config)})
    assert settings.capture_dir == "/data/x" and not settings.capture_on


@pytest.mark.parametrize("cli,yaml_text,expected", [
    ({"capture_dir": "relative/dir"}, None, "invalid --capture-dir 'relative/dir': must be an absolute path"),
    ({}, "mcc:\n  colour: blue\n", "unknown key mcc.colour"),
    ({}, "observability_enabled: true\n", "sets observability_enabled but no model_call_capture_dir"),
    ({"port": 70000}, None, "invalid --port 70000"),
    ({"capture_sync": "sometimes"}, None, "invalid --capture-sync 'sometimes': must be auto or fsync"),
    ({}, "mcc:\n  capture-sync: sometimes\n", "invalid mcc.capture-sync in c.yaml 'sometimes': must be auto or fsync"),
    ({"upstream": "http://vllm:8000/v1"}, None, "invalid --upstream 'http://vllm:8000/v1': must be the model server's "
                                               "root URL: drop '/v1' and pass http://vllm:8000"),
    ({"capture_enabled": True}, None, "--capture/--no-capture turns capture on but no capture directory is set"),
    ({}, "mcc: [unclosed\n", "at line 2, column 1"),
    ({"upstream": "ftp://x"}, None, "must be an http:// or https:// URL"),
    ({}, "- a list\n", "must be a YAML mapping"),
    ({}, "mcc: [unclosed\n", "is not valid YAML"),
])
def test_bad_configuration_is_one_clear_sentence(tmp_path, cli, yaml_text, expected):
    options = {"upstream": "http://u:1", **cli}
    if yaml_text is not None:
        (tmp_path / "c.yaml").write_text(yaml_text)
        options["config"] = str(tmp_path / "c.yaml")
    with pytest.raises(ConfigError) as caught:
        load_settings(options, environ={})
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_capture_sync_defaults_to_auto_and_takes_fsync_from_yaml(tmp_path):
    assert load_settings({"upstream": "http://u:1"}, environ={}).capture_sync == "auto"
    (tmp_path / "c.yaml").write_text("mcc:\n  capture_sync: FSYNC\n")
    assert load_settings({"upstream": "http://u:1", "config": str(tmp_path / "c.yaml")}, environ={}).capture_sync == "fsync"


def test_missing_upstream_is_refused():
    with pytest.raises(ConfigError, match="An upstream is required"):
        load_settings({}, environ={})


def test_unreadable_config_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings({"config": str(tmp_path / "missing.yaml"), "upstream": "http://u:1"}, environ={})


@pytest.mark.parametrize("args,message", [
    (["--upstream", "http://127.0.0.1:9", "--capture-dir", "rel"], "must be an absolute path"),
    (["--upstream", "http://127.0.0.1:9", "--config", "/nonexistent/c.yaml"], "cannot read config file"),
])
def test_serve_exits_non_zero_before_serving_on_bad_config(args, message):
    done = subprocess.run([*MCC, "serve", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "listening on" not in done.stdout


def test_serve_prints_the_ready_line_and_serves_with_env_settings(tmp_path):
    """`mcc serve --stand-in --port 0` with MCC_CAPTURE_DIR prints `listening on ...` and captures a call."""
    env = {**os.environ, "MCC_CAPTURE_DIR": str(tmp_path), "MCC_MODEL_NAME": "env-model"}
    process = subprocess.Popen([*MCC, "serve", "--stand-in", "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = read_line(process.stdout)
        assert line.startswith("listening on http://127.0.0.1:")
        url = line.split()[-1]
        request = urllib.request.Request(url + "/ng-rollout/cli-1/v1/chat/completions", method="POST",
                                         data=b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert reply.status == 200 and b"stand-in" in reply.read()
        with urllib.request.urlopen(url + "/-/ready", timeout=30) as reply:
            assert reply.status == 200
        with open(tmp_path / "cli-1.capture.jsonl", encoding="utf-8") as handle:
            assert '"name":"env-model"' in handle.read()
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0


@pytest.mark.slow
def test_workers_share_one_port_and_one_capture_dir(tmp_path):
    """`--workers 2`: one ready line, calls spread over both processes, all captured, SIGTERM stops all."""
    process = subprocess.Popen([*MCC, "serve", "--stand-in", "--port", "0", "--workers", "2", "--capture-dir", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = read_line(process.stdout).split()[-1]
        for number in range(40):
            post_chat(url, f"w-{number % 4}", close=True)
        time.sleep(1.5)  # Every worker's shared snapshot is at most a second old.
        for _ in range(20):  # Each scrape reaches one worker, and counts every worker's calls.
            with urllib.request.urlopen(url + "/-/metrics", timeout=30) as reply:
                lines = reply.read().decode().splitlines()
            assert len([line for line in lines if line.startswith("mcc_worker_info{")]) == 2
            assert sum(float(line.split()[-1]) for line in lines
                       if line.startswith("mcc_requests_total{") and 'captured="true"' in line) == 40
        store = CaptureStore(str(tmp_path))
        assert sum(len(store.read(rid)) for rid in store.rollout_ids()) == 40
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0
    # Issue 33, point 9: every worker's line says which worker wrote it, none says "workers 1", and
    # the supervisor's last line adds up the workers' drains.
    lines = process.stderr.read().splitlines()  # type: ignore[union-attr]
    workers = [line for line in lines if "mcc[worker " in line]
    supervisor = [line for line in lines if line not in workers]
    assert {line.split("mcc[worker ")[1][:4] for line in workers} == {"1/2]", "2/2]"}
    assert all(" INFO mcc: " in line for line in supervisor), supervisor
    assert len([line for line in workers if "drained: " in line]) == 2
    assert not any("workers 1" in line for line in lines) and sum("forwarding to" in line for line in workers) == 2
    assert supervisor[-1].endswith("all 2 workers stopped: 0 calls finished, 0 cut; exit 0"), supervisor


def test_a_capture_dir_that_is_a_file_is_a_configuration_error(tmp_path):
    """Issue 21, point 4: one sentence, exit 2, before serving."""
    target = tmp_path / "captures"
    target.write_text("not a directory")
    done = subprocess.run([*MCC, "serve", "--upstream", "http://127.0.0.1:9", "--capture-dir", str(target)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "is a file, not a directory" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "listening on" not in done.stdout


def test_startup_warns_of_a_capture_dir_without_its_parent_and_an_upstream_that_does_not_resolve(tmp_path):
    """An unmounted volume (or a typo) and a wrong upstream name are WARNINGs that name them; the
    sidecar still serves (the name may resolve later, the volume be mounted at the next start)."""
    capture_dir = tmp_path / "not-mounted" / "model-calls"
    process = subprocess.Popen([*MCC, "serve", "--port", "0", "--upstream", "http://no-such-host.invalid:8000",
                                "--capture-dir", str(capture_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert read_line(process.stdout, timeout=60).startswith("listening on ")
    finally:
        process.terminate()
        process.wait(timeout=30)
    stderr = process.stderr.read()  # type: ignore[union-attr]
    warnings = [line for line in stderr.splitlines() if "WARNING" in line.upper()]
    assert any(str(capture_dir) in line and "nor did its parent" in line for line in warnings), stderr
    assert any("'no-such-host.invalid' does not resolve" in line for line in warnings), stderr
    assert capture_dir.is_dir()


def test_the_workers_own_settings_are_never_suggested():
    warnings: list[str] = []
    load_settings({"upstream": "http://u:1"}, {"MCC_UPSTRAEM": "x"}, warnings.append)
    (said,) = warnings
    assert "MCC_UPSTREAM" in said and "MCC_METRICS_DIR" not in said and "MCC_REUSE_PORT" not in said


def test_a_typo_is_never_answered_with_an_option_only_the_supervisor_uses():
    for typo in ("--reuse", "--metrics", "--worker"):
        done = subprocess.run([*MCC, "serve", typo], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "No such option" in done.stderr
        assert not any(hidden in done.stderr for hidden in ("--reuse-port", "--metrics-dir", "--worker-index",
                                                             "--worker-count")), done.stderr


@pytest.mark.slow
def test_the_stand_in_runs_alone_on_a_chosen_port_and_waits_as_asked():
    """`mcc stand-in --port N` (issue 23: Gym's policy_model points at :8000): it says where it
    listens, answers every dialect, waits --delay before a reply, stops on SIGTERM; a port in
    use is one sentence, exit 2."""
    import json
    import signal
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "proxy", "stand-in", "--port", str(port), "--delay", "0.3"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert read_line(process.stdout).startswith(f"stand-in model server listening on http://127.0.0.1:{port}")
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/responses", method="POST",
                                         data=b'{"model": "m", "input": "hi"}', headers={"Content-Type": "application/json"})
        started = time.monotonic()
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert json.loads(reply.read())["status"] == "completed"
        assert time.monotonic() - started >= 0.3, "--delay holds each reply"
        taken = subprocess.run([sys.executable, "-m", "proxy", "stand-in", "--port", str(port)], capture_output=True,
                               text=True, timeout=30)
        assert taken.returncode == 2 and taken.stderr.startswith(f"mcc: cannot listen on 127.0.0.1:{port}")
        assert taken.stderr.count("\n") == 1
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0


@pytest.mark.parametrize("settings, environ, said", [
    ({"upstream": "http://u", "capture_tokens": True}, {}, "--capture-tokens (MCC_CAPTURE_TOKENS) needs capture on"),
    ({"upstream": "http://u", "stand_in": True}, {}, "--stand-in serves its own model"),
    ({"upstream": "http://u", "read_timeout": 1e9}, {}, "3600"),
    ({"upstream": "http://u", "shutdown_delay": 1e9}, {}, "3600"),
])
def test_no_setting_is_silently_ignored_or_absurd(settings, environ, said):
    """Issue 33, point 3: a setting that would do nothing, or a server never used, or a timeout of
    years, is refused in one sentence before anything starts."""
    from proxy import ConfigError, load_settings
    with pytest.raises(ConfigError, match=re.escape(said)):
        load_settings(settings, environ)


def test_a_misspelt_variable_gets_the_likely_one():
    from proxy import load_settings
    heard = []
    load_settings({"upstream": "http://u"}, {"MCC_CAPTURE_TOKEN": "1"}, heard.append)
    assert heard == ["ignoring unknown environment variable MCC_CAPTURE_TOKEN: did you mean MCC_CAPTURE_TOKENS?"]


@pytest.mark.slow
def test_the_supervisor_adds_up_what_its_workers_drained(tmp_path):
    """Issue 33, point 9: calls in flight at SIGTERM finish in whichever worker has them, each worker
    says its own count, and the supervisor's last line says the sum."""
    from concurrent.futures import ThreadPoolExecutor

    stand_in = subprocess.Popen([*MCC, "stand-in", "--port", "0", "--delay", "2"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    process = None
    try:
        upstream = read_line(stand_in.stdout).split(" listening on ")[1].split()[0]
        process = subprocess.Popen([*MCC, "serve", "--upstream", upstream, "--port", "0", "--workers", "2",
                                    "--capture-dir", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        url = read_line(process.stdout).split()[-1]
        with ThreadPoolExecutor(6) as pool:
            calls = [pool.submit(post_chat, url, f"drain-{number}", close=True) for number in range(6)]
            time.sleep(1.0)  # All six are waiting on the stand-in's 2 s.
            process.terminate()
            assert [call.result()[0] for call in calls] == [200] * 6
        assert process.wait(timeout=60) == 0
    finally:
        stand_in.terminate()
        stand_in.wait(timeout=30)
        if process is not None and process.poll() is None:
            process.kill()
    lines = process.stderr.read().splitlines()  # type: ignore[union-attr]
    drained = [int(re.search(r"drained: (\d+) call", line).group(1)) for line in lines if "mcc[worker" in line and "drained: " in line]
    assert len(drained) == 2 and sum(drained) == 6, lines
    assert lines[-1].endswith("all 2 workers stopped: 6 calls finished, 0 cut; exit 0"), lines
    store = CaptureStore(str(tmp_path))
    assert sorted(store.rollout_ids()) == sorted(f"drain-{number}" for number in range(6))


def test_serve_help_is_grouped_with_the_url_shape_an_example_and_the_reference():
    """Every option a user sets shows once, under its group's heading; the help says where agents
    point (/ng-rollout/<rollout_id>/v1), shows a command to copy and names docs/configuration.md."""
    from proxy import main

    serve = main.commands["serve"]
    done = subprocess.run([*MCC, "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    headings = [f"\n{title}:\n" for title in ("Forward and listen", "Capture", "Training token ids",
                                                 "The upstream connection", "Client connections", "Shutdown", "Logs")]
    assert all(heading in text for heading in headings) and [text.index(h) for h in headings] == sorted(
        text.index(h) for h in headings)
    shown = [opt for param in serve.params if not getattr(param, "hidden", False) and param.name != "help"
             for opt in param.opts[:1]]
    for option in shown:
        assert len(re.findall(rf"^  {re.escape(option)}(?=[ \n])", text, re.M)) == 1, option
    assert "/ng-rollout/<rollout_id>/v1" in text and "docs/configuration.md" in text
    assert "mcc serve --upstream http://127.0.0.1:8000 --capture-dir /data/model-calls" in text
    for hidden in ("--reuse-port", "--metrics-dir", "--worker-index", "--worker-count"):
        assert hidden not in text
