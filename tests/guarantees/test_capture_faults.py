"""Promise 3 — capture faults never hurt a call: read-only, removed and full capture directories.

Read-only and full filesystems are real: a small tmpfs mounted for the test (root only; the tests
skip with a message where mounting is not allowed), and a file-size limit in a subprocess (EFBIG).
"""

from __future__ import annotations

import logging
import os
import subprocess
import urllib.request

import pytest

from tests.capture_dirs import remove_live_capture_dir, rollout_files
from tests.processes import SidecarProcess
from tests.scripted_upstream import sse_script
from tests.proxy.app.test_metrics_and_logs import scrape, value
from tests.transcripts import CHAT_REQUEST, CHAT_STREAM
from tests.wire import assert_same_reply, fetch, rollout_url

CHAT = "/v1/chat/completions"


@pytest.fixture
def tmpfs(tmp_path):
    """A 256 KiB tmpfs; yields (path, remount) where remount('ro'|'rw'|'size=...') changes it."""
    path = tmp_path / "mnt"
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")

    def remount(option: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{option}", str(path)], check=True)

    try:
        yield str(path), remount
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


async def _calls_keep_their_bytes(http, upstream, sidecar, rollout, count):
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_REQUEST)
    for _ in range(count):
        assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, rollout, CHAT), CHAT_REQUEST))


def _failure_logs(caplog, rollout=""):
    return [r for r in caplog.records if f"capture failed for rollout {rollout}" in r.getMessage()]


async def test_read_only_capture_dir(http, upstream, start, tmpfs, caplog):
    path, remount = tmpfs
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM)
    sidecar = await start(upstream.url, capture_dir=path)
    remount("ro")
    with caplog.at_level(logging.ERROR, logger="mcc.capture"):
        await _calls_keep_their_bytes(http, upstream, sidecar, "ro-1", 5)
        for number in range(20):  # Many rollouts on one read-only volume: one line, not one a rollout.
            await _calls_keep_their_bytes(http, upstream, sidecar, f"ro-other-{number}", 1)
    (logged,) = _failure_logs(caplog)
    assert "(EROFS)" in logged.getMessage() and logged.path == path and logged.kind == "EROFS"
    assert value(await scrape(http, sidecar), "mcc_capture_failures_total", kind="EROFS") == 25
    assert rollout_files(path) == []  # Not even the marker can be written on a read-only volume.
    remount("rw")
    await _calls_keep_their_bytes(http, upstream, sidecar, "ro-1", 1)
    assert os.path.getsize(os.path.join(path, "ro-1.capture.jsonl")) > 0, "capture resumes by itself"


async def test_full_filesystem(http, upstream, start, tmpfs, caplog):
    path, remount = tmpfs
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM)
    sidecar = await start(upstream.url, capture_dir=path)
    with caplog.at_level(logging.ERROR, logger="mcc.capture"):
        await _calls_keep_their_bytes(http, upstream, sidecar, "full-1", 200)  # ~2 KB lines into 256 KiB.
    failures = value(await scrape(http, sidecar), "mcc_capture_failures_total", kind="ENOSPC")
    assert failures > 0 and len(_failure_logs(caplog, "full-1")) == 1
    assert os.path.exists(os.path.join(path, "full-1.capture.incomplete"))
    lines_before = open(os.path.join(path, "full-1.capture.jsonl"), "rb").read()
    assert lines_before.endswith(b"\n"), "a failed append leaves no torn line"
    remount("size=16m")
    await _calls_keep_their_bytes(http, upstream, sidecar, "full-1", 1)
    assert len(open(os.path.join(path, "full-1.capture.jsonl"), "rb").read()) > len(lines_before)


async def test_capture_dir_removed_while_running(http, upstream, sidecar, capture_dir, caplog):
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM)
    remove_live_capture_dir(capture_dir)
    with caplog.at_level(logging.ERROR, logger="mcc.capture"):
        await _calls_keep_their_bytes(http, upstream, sidecar, "gone-1", 3)
    assert len(_failure_logs(caplog, "gone-1")) == 1
    assert value(await scrape(http, sidecar), "mcc_capture_failures_total", kind="ENOENT") == 3
    os.mkdir(capture_dir)
    await _calls_keep_their_bytes(http, upstream, sidecar, "gone-1", 1)
    assert os.path.exists(os.path.join(capture_dir, "gone-1.capture.jsonl"))


async def test_file_size_limit_in_a_subprocess_gives_efbig(http, upstream, tmp_path):
    """RLIMIT_FSIZE with SIGXFSZ ignored: appends fail with EFBIG, calls are untouched."""
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM)
    sidecar = SidecarProcess.start("--upstream", upstream.url, "--capture-dir", str(tmp_path), file_size_limit=20_000)
    try:
        await _calls_keep_their_bytes(http, upstream, sidecar, "big-1", 30)
        with urllib.request.urlopen(sidecar.url + "/-/metrics", timeout=30) as reply:
            metrics = reply.read().decode()
    finally:
        assert sidecar.terminate() == 0
    assert 'mcc_capture_failures_total{kind="EFBIG"}' in metrics
    assert sum("capture failed for rollout big-1 (EFBIG)" in line for line in sidecar.stderr_lines) == 1
    assert os.path.exists(tmp_path / "big-1.capture.incomplete")
    data = (tmp_path / "big-1.capture.jsonl").read_bytes()
    assert 0 < len(data) <= 20_000 and data.endswith(b"\n")
