"""Deploying and operating the sidecar without losing a call (issue 15): drain, readiness,
misconfiguration, many workers, and errors said once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import aiohttp
import orjson
import pytest
from click.testing import CliRunner

from proxy import main
from records import CaptureStore

from tests.compiled_core import require_compiled_core
from tests.processes import SidecarProcess, post_chat, read_line
from tests.scripted_upstream import split_every, sse_script
from tests.transcripts import CHAT_REQUEST, CHAT_STREAM

from tests import CHECKOUT

CHAT = "/v1/chat/completions"


@pytest.mark.slow
async def test_calls_cut_by_the_drain_timeout_are_recorded_as_cancelled(upstream, tmp_path):
    """SIGTERM with a stream longer than the drain: the line is written (cancelled, the partial
    reassembly, every byte relayed so far), the log says what happened, exit 0."""
    pieces = split_every(CHAT_STREAM, 60)
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM, pieces, pause=0.4)  # About 4 s of stream.
    sidecar = SidecarProcess.start("--upstream", upstream.url, "--capture-dir", str(tmp_path), "--drain-timeout", "0.5")
    received = bytearray()

    async def stream(http: aiohttp.ClientSession) -> str:
        async with http.post(f"{sidecar.url}/ng-rollout/cut{CHAT}", data=CHAT_REQUEST) as response:
            try:
                async for chunk in response.content.iter_any():
                    received.extend(chunk)
            except aiohttp.ClientPayloadError:
                return "cut"
        return "ended"

    async with aiohttp.ClientSession() as http:
        task = asyncio.create_task(stream(http))
        while len(received) < 5 * 60:  # The role chunk and the reasoning chunk have arrived.
            await asyncio.sleep(0.05)
        sidecar.process.send_signal(signal.SIGTERM)
        assert await task == "cut"
    assert await asyncio.to_thread(sidecar.process.wait, 30) == 0
    (line,) = CaptureStore(tmp_path).read("cut")
    assert line["error_category"] == "cancelled" and line["stream_truncated"] is True
    assert line["response_raw"].encode() == bytes(received), "the bytes relayed so far, exactly"
    assert line["response"]["choices"][0]["message"] is not None
    assert "drain timeout" in line["failure"]["message"]
    log = "".join(sidecar.stderr_lines)
    assert "drain timeout (0.5s) reached with 1 call(s) still in flight" in log
    assert "forwarded unchanged" not in log and "capture failed" not in log
    assert not (tmp_path / "cut.capture.incomplete").exists()


def test_rollouts_with_only_an_incomplete_marker_are_listed_as_incomplete(tmp_path):
    """Every line of such a rollout was lost: readers must show it, not hide it."""
    (tmp_path / "lost.capture.incomplete").write_bytes(b"")
    (tmp_path / "kept.capture.jsonl").write_bytes(b'{"model_call_id": "a", "status_code": 200}\n')
    assert CaptureStore(tmp_path).rollout_ids() == ["kept", "lost"]
    listing = [orjson.loads(line) for line in CliRunner().invoke(main, ["ls", str(tmp_path), "--json"]).output.splitlines()]
    assert [(row["rollout_id"], row["incomplete"]) for row in listing] == [("kept", False), ("lost", True)]
    stats = CliRunner().invoke(main, ["stats", str(tmp_path), "--json"]).output
    assert orjson.loads(stats)["incomplete_rollouts"] == 1
    summary = subprocess.run([sys.executable, "-m", "records", str(tmp_path)], capture_output=True, text=True, check=True)
    assert [orjson.loads(line)["incomplete"] for line in summary.stdout.splitlines()] == [False, True]


MCC = [sys.executable, "-m", "proxy"]


def _serve_fails(*args: str, env: dict[str, str] | None = None) -> str:
    """Run `mcc serve ARGS`, expect exit 2 before serving; its stderr."""
    done = subprocess.run([*MCC, "serve", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "listening on" not in done.stdout and "Traceback" not in done.stderr
    return done.stderr


def test_an_upstream_with_a_path_is_refused_with_the_fix():
    """`--upstream http://host:8000/v1` (copied from SDK settings) would send every call to /v1/v1/."""
    stderr = _serve_fails("--upstream", "http://127.0.0.1:8000/v1")
    assert len(stderr.strip().splitlines()) == 1
    assert "drop '/v1' and pass http://127.0.0.1:8000" in stderr


def test_a_port_in_use_and_an_unknown_host_are_one_sentence():
    import socket
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stderr = _serve_fails("--upstream", "http://127.0.0.1:9", "--port", str(port))
    assert stderr.strip().splitlines() == [f"mcc: cannot listen on 127.0.0.1:{port}: the port is already in use "
                                           "(pick another with --port, or 0 for any free port)."]
    stderr = _serve_fails("--upstream", "http://127.0.0.1:9", "--host", "no-such-host.invalid", "--port", "0")
    assert len(stderr.strip().splitlines()) == 1 and "'no-such-host.invalid' does not resolve" in stderr


def test_capture_turned_on_without_a_directory_is_refused():
    assert "turns capture on but no capture directory is set" in _serve_fails("--upstream", "http://u:1", "--capture")
    stderr = _serve_fails("--upstream", "http://u:1", env={"MCC_CAPTURE_ENABLED": "true", "MCC_CAPTURE_DIR": ""})
    assert "MCC_CAPTURE_ENABLED turns capture on but no capture directory is set" in stderr


def test_startup_says_what_it_will_do(tmp_path):
    """One line with upstream, capture, dir, sync mode, workers; a new capture dir is created and said;
    an unknown MCC_* variable is warned about."""
    capture_dir = tmp_path / "new" / "captures"
    sidecar = SidecarProcess.start("--stand-in", "--capture-dir", str(capture_dir), env={"MCC_CAPTUR_DIR": "/typo"})
    try:
        assert capture_dir.is_dir()
    finally:
        assert sidecar.terminate() == 0
    log = "".join(sidecar.stderr_lines)
    assert "ignoring unknown environment variable MCC_CAPTUR_DIR" in log
    assert f"WARNING mcc: the capture dir {capture_dir} did not exist, nor did its parent" in log
    (startup,) = [line for line in sidecar.stderr_lines if "forwarding to " in line]
    assert (f"capture on: dir {capture_dir}, sync auto, raw stream always; privacy full: no redaction "
            "(--redact, --redact-hook); per-event core compiled; workers 1; drain timeout 25s" in startup)


def _logprob_stream(tokens: int) -> bytes:
    """A vLLM logprob stream long enough for the event templates (a logprob entry and an id a chunk)."""
    head = {"id": "chatcmpl-core", "object": "chat.completion.chunk", "created": 1767225600, "model": "m"}
    events = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}]}]
    events += [{**head, "choices": [{"index": 0, "delta": {"content": f" t{step}"}, "logprobs": {"content": [
        {"token": f" t{step}", "logprob": -0.125 * step, "bytes": list(f" t{step}".encode()), "top_logprobs": []}]},
        "finish_reason": "stop" if step == tokens - 1 else None, "token_ids": [1000 + step]}]} for step in range(tokens)]
    events.append({**head, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": tokens,
                                                     "total_tokens": 3 + tokens}})
    return b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("variable, said", [(None, "compiled"), ("1", "pure Python (MCC_NO_EXTENSIONS is set)")])
async def test_the_per_event_core_is_said_at_start_and_in_ready_and_either_captures_the_stream(upstream, tmp_path, variable,
                                                                                                said):
    """The compiled core by default (`make install` builds it), the pure Python with
    MCC_NO_EXTENSIONS=1: said once at start and in /-/ready; a logprob stream, long enough for the
    event templates, reaches the client as it came and gives the same line on both (docs/speed.md)."""
    if variable is None:
        require_compiled_core()
    stream = _logprob_stream(300)
    upstream.scripts["/v1/chat/completions"] = sse_script(stream)
    sidecar = SidecarProcess.start("--upstream", upstream.url, "--capture-dir", str(tmp_path),
                                   env={"MCC_NO_EXTENSIONS": variable or ""})
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{sidecar.url}/-/ready") as reply:
                assert (await reply.json())["per_event_core"] == said
            async with session.post(f"{sidecar.url}/ng-rollout/core-1/v1/chat/completions",
                                    data=orjson.dumps({**orjson.loads(CHAT_REQUEST), "stream": True, "logprobs": True})) as reply:
                assert await reply.read() == stream
    finally:
        assert sidecar.terminate() == 0
    (startup,) = [line for line in sidecar.stderr_lines if "forwarding to " in line]
    assert f"; per-event core {said};" in startup
    assert "unknown environment variable" not in "".join(sidecar.stderr_lines), "MCC_NO_EXTENSIONS is a variable of ours"
    (line,) = CaptureStore(str(tmp_path)).read("core-1")
    choice = line["response"]["choices"][0]
    assert choice["message"]["content"] == "".join(f" t{step}" for step in range(300))
    assert [entry["logprob"] for entry in choice["logprobs"]["content"]] == [-0.125 * step for step in range(300)]
    assert choice["token_ids"] == list(range(1000, 1300)) and line["response"]["usage"]["completion_tokens"] == 300


def test_a_top_level_upstream_in_yaml_is_pointed_at_mcc_upstream(tmp_path):
    (tmp_path / "c.yaml").write_text("observability_enabled: false\nupstream: http://vllm:8000\n")
    stderr = _serve_fails("--config", str(tmp_path / "c.yaml"), env={"MCC_UPSTREAM": ""})
    assert "An upstream is required" in stderr and "(mcc.upstream)" in stderr


async def test_a_404_that_looks_like_a_base_url_mistake_is_forwarded_and_explained_once(http, upstream, sidecar, caplog):
    import logging

    from tests.scripted_upstream import json_script
    from tests.wire import assert_same_reply, fetch, rollout_url
    body = b'{"detail": "Not Found"}'
    for path in ("/chat/completions", "/v1/v1/messages", "//v1/chat/completions"):
        upstream.scripts[path] = json_script(body, status=404, reason="Not Found")
    with caplog.at_level(logging.WARNING, logger="mcc"):
        for _ in range(3):
            direct = await fetch(http, "POST", upstream.url + "/chat/completions", CHAT_REQUEST)
            proxied = await fetch(http, "POST", rollout_url(sidecar.url, "r", "/chat/completions"), CHAT_REQUEST)
            assert_same_reply(direct, proxied)
        await fetch(http, "POST", rollout_url(sidecar.url, "r", "/v1/v1/messages"), CHAT_REQUEST)
        for _ in range(2):  # A base_url ending in '/': http://sidecar/ng-rollout/r/ + /v1/chat/completions.
            direct = await fetch(http, "POST", upstream.url + "//v1/chat/completions", CHAT_REQUEST)
            proxied = await fetch(http, "POST", sidecar.url + "/ng-rollout/r//v1/chat/completions", CHAT_REQUEST)
            assert_same_reply(direct, proxied)
    hints = [r.getMessage() for r in caplog.records if "404" in r.getMessage()]
    assert len(hints) == 3, hints
    assert "has no /v1: OpenAI SDKs need base_url http://sidecar/ng-rollout/<id>/v1" in hints[0]
    assert "/v1 twice" in hints[1] and "Anthropic SDK adds /v1 itself" in hints[1]
    assert "begins with '//'" in hints[2] and "drop the trailing '/'" in hints[2]


async def test_a_down_upstream_is_said_once_with_a_count_and_json_lines_carry_context(http, start, capture_dir, caplog):
    import logging

    from proxy.app import JsonFormatter
    from proxy.app import free_port

    from tests.wire import fetch, rollout_url
    sidecar = await start(f"http://127.0.0.1:{free_port()}", capture_dir=capture_dir)
    with caplog.at_level(logging.WARNING, logger="mcc"):
        for _ in range(5):
            assert (await fetch(http, "POST", rollout_url(sidecar.url, "down-1", CHAT), CHAT_REQUEST)).status == 502
    warnings = [r for r in caplog.records if "failed before replying" in r.getMessage()]
    assert len(warnings) == 1, "one line, not one per call"
    entry = orjson.loads(JsonFormatter().format(warnings[0]))
    assert (entry["rollout_id"], entry["status"], entry["errno"]) == ("down-1", 502, 111)  # ECONNREFUSED


async def test_413_and_the_access_log(http, upstream, start, capture_dir, caplog):
    import logging

    from tests.scripted_upstream import json_script
    from tests.transcripts import CHAT_JSON
    from tests.wire import fetch, rollout_url
    sidecar = await start(upstream.url, capture_dir=capture_dir, max_body_bytes=64)
    upstream.scripts[CHAT] = json_script(CHAT_JSON)
    with caplog.at_level(logging.DEBUG, logger="mcc"):
        assert (await fetch(http, "POST", rollout_url(sidecar.url, "ok", CHAT), b"{}")).status == 200
        assert (await fetch(http, "POST", rollout_url(sidecar.url, "big", CHAT), b"x" * 100)).status == 413
    assert any("over the limit of 64 bytes (413)" in r.getMessage() for r in caplog.records)
    access = [r.getMessage() for r in caplog.records if r.name == "mcc.access"]
    assert access == ["POST /ng-rollout/ok/v1/chat/completions 200 captured=true",
                      "POST /ng-rollout/big/v1/chat/completions 413 captured=true"]


@pytest.mark.slow
def test_worker_metrics_never_go_backwards_under_load(tmp_path):
    """`--workers 2`: successive scrapes (answered by either worker) never see a counter decrease,
    and once the load stops every scrape counts every call."""
    import threading
    import urllib.request
    process = subprocess.Popen([*MCC, "serve", "--stand-in", "--port", "0", "--workers", "2", "--capture-dir", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = read_line(process.stdout).split()[-1]
        stop, made = threading.Event(), []

        def load() -> None:
            while not stop.is_set():
                post_chat(url, f"m-{len(made) % 3}", close=True)
                made.append(1)

        def scrape() -> tuple[float, set[str]]:
            with urllib.request.urlopen(url + "/-/metrics", timeout=30) as reply:
                lines = reply.read().decode().splitlines()
            total = sum(float(line.split()[-1]) for line in lines if line.startswith("mcc_requests_total{"))
            return total, {line for line in lines if line.startswith("mcc_worker_info{")}

        threads = [threading.Thread(target=load) for _ in range(3)]
        for thread in threads:
            thread.start()
        seen, workers = [], set()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            total, answered = scrape()
            seen.append(total)
            workers |= answered
            time.sleep(0.02)
        stop.set()
        for thread in threads:
            thread.join()
        assert len(workers) == 2 and len(seen) > 20
        assert all(later >= earlier for earlier, later in zip(seen, seen[1:])), seen
        time.sleep(1.5)
        scrapes = [scrape()[0] for _ in range(6)]
        assert scrapes == [len(made)] * 6, "every call of the load, counted once, by every worker's scrape"
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0


@pytest.mark.slow
def test_the_demo_runs_and_ends_with_what_to_try_next(tmp_path):
    done = subprocess.run([*MCC, "demo", "--capture-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "13 calls captured in 7 rollouts" in done.stdout and "source=token_file" in done.stdout
    assert "(!!" not in done.stdout, "the agent never sees the token data the sidecar added"
    assert "demo-rl #1: " in done.stdout and "usable=True (extends #0, sent on its exact ids: prefix supply)" in done.stdout
    # The template that drops the reasoning would drift; prefix supply (the token mode's default) holds it.
    drifting = done.stdout[done.stdout.index("demo-rl-drift #1: "):].splitlines()[0]
    assert drifting.endswith("usable=True (extends #0, sent on its exact ids: prefix supply)"), drifting
    assert "demo-rl        2 call(s)" in done.stdout and "demo-rl-drift  2 call(s), 117 ids, 34 trained; trainable" in done.stdout
    tail = done.stdout[done.stdout.index("next, on these captures:"):]
    assert f"mcc ls {tmp_path}" in tail and f"mcc report {tmp_path} -o report.html" in tail
    listing = CliRunner().invoke(main, ["ls", str(tmp_path)])
    assert listing.exit_code == 0 and "demo-rl" in listing.output


def test_make_demo_installs_only_what_the_demo_needs():
    root = CHECKOUT
    with open(os.path.join(root, "Makefile"), encoding="utf-8") as handle:
        makefile = handle.read()
    demo_recipe = makefile[makefile.index("$(DEMO_STAMP): pyproject.toml"):makefile.index("\ndemo:")]
    assert "-e '.[demo]'" in demo_recipe and ",test" not in demo_recipe
    assert "demo: $(DEMO_STAMP)" in makefile


def _metrics_text(url: str) -> str:
    import urllib.request
    with urllib.request.urlopen(url + "/-/metrics", timeout=30) as reply:
        return reply.read().decode()


def _requests_total(text: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("mcc_requests_total{"))


@pytest.mark.slow
def test_a_worker_killed_with_sigkill_is_noticed_logged_and_replaced(tmp_path):
    """Issue 21, point 2: the supervisor notices at once, says so, restarts the worker; the dead pid
    leaves mcc_worker_info, its counters stay in the sums (never going down)."""
    import urllib.request
    process = subprocess.Popen([*MCC, "serve", "--stand-in", "--port", "0", "--workers", "2", "--capture-dir", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = read_line(process.stdout).split()[-1]
        for number in range(10):
            post_chat(url, f"k-{number}", close=True)
        time.sleep(1.5)  # Every worker's snapshot is at most a second old.
        before = _metrics_text(url)
        pids = {line.split('"')[1] for line in before.splitlines() if line.startswith("mcc_worker_info{")}
        assert len(pids) == 2
        victim = sorted(pids)[0]
        os.kill(int(victim), signal.SIGKILL)
        deadline = time.monotonic() + 30
        after = ""
        while time.monotonic() < deadline:
            time.sleep(0.5)
            after = _metrics_text(url)
            now = {line.split('"')[1] for line in after.splitlines() if line.startswith("mcc_worker_info{")}
            if victim not in now and len(now) == 2:
                break
        else:
            raise AssertionError(f"the dead worker {victim} is still in the scrape, or none replaced it: {after}")
        assert _requests_total(after) >= _requests_total(before) == 10, "its counts stay: counters never go down"
        with urllib.request.urlopen(url + "/-/ready", timeout=30) as reply:
            assert reply.status == 200
    finally:
        process.terminate()
        code = process.wait(timeout=60)
    stderr = process.stderr.read()  # type: ignore[union-attr]
    assert code == 0, stderr
    assert f"(pid {victim}) died (signal 9)" in stderr and "restarted as pid" in stderr
    assert "2 workers on :" in stderr and "mcc[worker 1/2]: pid " in stderr and "mcc[worker 2/2]: pid " in stderr


@pytest.mark.slow
def test_workers_find_a_writable_metrics_dir_or_say_why_not(tmp_path):
    """A read-only /tmp (the shipped Kubernetes sidecar without its emptyDir): the next candidate
    is used; with none writable, one sentence (exit 2 from `mcc serve`)."""
    from proxy.app import Settings
    from proxy.app._workers import NoMetricsDir, make_metrics_dir

    read_only = tmp_path / "ro"
    read_only.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(read_only)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here (needs root): {done.stderr.strip()}")
    try:
        settings = Settings(upstream="http://u:1", workers=2)
        with pytest.raises(NoMetricsDir, match="needs a writable directory for the workers' metrics"):
            make_metrics_dir(settings, [str(read_only)])
        writable = tmp_path / "rw"
        writable.mkdir()
        assert make_metrics_dir(settings, [str(read_only), str(writable)]).startswith(str(writable))
        process = subprocess.Popen([*MCC, "serve", "--stand-in", "--port", "0", "--workers", "2"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(read_only)})
        try:
            assert read_line(process.stdout, timeout=60).startswith("listening on "), "served with /tmp read-only"
        finally:
            process.terminate()
            assert process.wait(timeout=60) == 0
    finally:
        subprocess.run(["umount", "-l", str(read_only)], check=False)


async def test_a_slash_in_a_rollout_id_is_forwarded_and_explained_once(http, upstream, sidecar, caplog):
    """`/ng-rollout/gsm8k/17/v1/...`: the id is `gsm8k`, the path `/17/v1/...`; the upstream's 404 is
    forwarded as it came, and the log says why once, however many samples make the mistake."""
    import logging

    from tests.scripted_upstream import json_script
    from tests.wire import assert_same_reply, fetch
    body = b'{"detail": "Not Found"}'
    for sample in (17, 18, 19):
        upstream.scripts[f"/{sample}/v1/chat/completions"] = json_script(body, status=404, reason="Not Found")
    with caplog.at_level(logging.WARNING, logger="mcc"):
        for sample in (17, 18, 19):
            direct = await fetch(http, "POST", upstream.url + f"/{sample}/v1/chat/completions", CHAT_REQUEST)
            proxied = await fetch(http, "POST", f"{sidecar.url}/ng-rollout/gsm8k/{sample}/v1/chat/completions", CHAT_REQUEST)
            assert_same_reply(direct, proxied)
    hints = [r.getMessage() for r in caplog.records if "404" in r.getMessage()]
    assert len(hints) == 1, hints
    assert "/17/v1/chat/completions" in hints[0] and "a rollout id cannot hold a '/'" in hints[0]
    assert "ng-rollout/gsm8k-17/v1" in hints[0]


async def test_a_rollout_call_while_capture_is_off_is_forwarded_and_said_once(http, upstream, start, caplog):
    import logging

    from tests.scripted_upstream import json_script
    from tests.wire import assert_same_reply, fetch, rollout_url
    upstream.scripts["/v1/chat/completions"] = json_script(b'{"id": "c"}')
    sidecar = await start(upstream.url)  # No capture dir: capture is off.
    with caplog.at_level(logging.WARNING, logger="mcc"):
        for rollout in ("r1", "r2"):
            direct = await fetch(http, "POST", upstream.url + "/v1/chat/completions", CHAT_REQUEST)
            proxied = await fetch(http, "POST", rollout_url(sidecar.url, rollout, "/v1/chat/completions"), CHAT_REQUEST)
            assert_same_reply(direct, proxied)
    said = [r.getMessage() for r in caplog.records if "capture is off" in r.getMessage()]
    assert said == ["a call for rollout r1 came while capture is off: forwarded, NOT captured (start the sidecar "
                    "with --capture-dir DIR, or MCC_CAPTURE_DIR, to record calls)"]


async def test_a_port_in_use_fails_before_anything_is_made(tmp_path):
    """The port is bound first: a sidecar that cannot listen leaves no capture dir behind (nor a
    capture process), and one that can serves as before."""
    import socket

    import pytest

    from proxy import Settings, Sidecar
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        capture_dir = tmp_path / "captures"
        sidecar = Sidecar(Settings(upstream="http://127.0.0.1:9", host="127.0.0.1", port=port, capture_dir=str(capture_dir)))
        with pytest.raises(OSError):
            await sidecar.start()
        assert not capture_dir.exists(), "nothing is created for a sidecar that cannot listen"
        assert sidecar.journal is None
    sidecar = Sidecar(Settings(upstream="http://127.0.0.1:9", host="127.0.0.1", port=0, capture_dir=str(capture_dir)))
    await sidecar.start()
    try:
        assert capture_dir.is_dir()
    finally:
        await sidecar.close()


@pytest.mark.parametrize("path", ["/inference/v1/generate", "/v1/chat/completions/render", "/v1/responses/render",
                                  "/v1/completions/derender"])
async def test_a_404_from_vllms_scale_out_endpoints_says_to_start_vllm_with_scale_out(http, upstream, sidecar, caplog,
                                                                                      path):
    """vLLM serves /inference/v1/generate, /render and /derender only with --enable-scale-out (vLLM
    #54579, #55176): their 404 is forwarded unchanged and the log says which flag is missing, once."""
    import logging

    from tests.scripted_upstream import json_script
    from tests.wire import assert_same_reply, fetch, rollout_url
    upstream.scripts[path] = json_script(b'{"detail": "Not Found"}', status=404, reason="Not Found")
    body = b'{"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 4}}'
    with caplog.at_level(logging.WARNING, logger="mcc"):
        for _ in range(2):
            direct = await fetch(http, "POST", upstream.url + path, body)
            assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, "g", path), body))
    (hint,) = [r.getMessage() for r in caplog.records if "404" in r.getMessage()]
    assert "--enable-scale-out" in hint and path in hint
