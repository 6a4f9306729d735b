"""A full disk told truthfully and freed space freed (issue 30, points 9 and 10), on a real small
tmpfs: readiness and ``mcc_capture_dir_writable`` follow the last write, and the capture files the
sidecar holds open stop holding a disk an operator frees by moving finished rollouts away."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess

import orjson
import pytest

import capture.journal._group_commit as group_commit
import capture.journal._open_files as open_files
from capture.journal._open_files import OpenFiles
from tests.scripted_upstream import json_script
from tests.wire import fetch, rollout_url

REPLY = b'{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}'


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (root, or a mount namespace that allows it); skipped, with why, elsewhere."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.strip() or 'mount failed'}): "
                    "the full-disk tests need root or CAP_SYS_ADMIN")
    (mount_point / "captures").mkdir()
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(path) -> None:
    """Write ``path`` until the disk refuses (ENOSPC)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"x" * 1024)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)


def free_bytes(path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


async def ready_and_gauge(http, sidecar) -> tuple[dict, str]:
    ready = orjson.loads((await fetch(http, "GET", sidecar.url + "/-/ready")).body)
    metrics = (await fetch(http, "GET", sidecar.url + "/-/metrics")).body.decode()
    gauge = next(line for line in metrics.splitlines() if line.startswith("mcc_capture_dir_writable "))
    return ready, gauge.split()[1]


async def test_a_full_disk_is_failing_until_a_line_is_written_again(http, upstream, start, small_disk):
    """After ENOSPC, /-/ready says capture failing (with why) and the gauge is 0, though the directory's
    mode is writable; the calls themselves are answered as ever; freed space, one line, healthy again."""
    upstream.scripts["/v1/chat/completions"] = json_script(REPLY)
    captures = str(small_disk / "captures")
    sidecar = await start(upstream.url, capture_dir=captures)
    url = rollout_url(sidecar.url, "full", "/v1/chat/completions")
    assert (await fetch(http, "POST", url, b'{"model":"m","messages":[]}')).body == REPLY
    ready, gauge = await ready_and_gauge(http, sidecar)
    assert (ready["capture"], gauge) == ("ok", "1.0")
    fill(small_disk / "filler")
    big = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "q" * 9000}]})  # Past a page's slack.
    for _ in range(3):
        reply = await fetch(http, "POST", url, big)
        assert (reply.status, reply.body) == (200, REPLY), "a capture fault never changes the reply"
    ready, gauge = await ready_and_gauge(http, sidecar)
    assert ready["capture"] == "failing" and "ENOSPC" in ready["capture_problem"], ready
    assert ready["capture_dir_writable"] is True and ready["status"] == "ready"
    assert gauge == "0.0"
    os.unlink(small_disk / "filler")
    await fetch(http, "POST", url, b'{"model":"m","messages":[]}')
    ready, gauge = await ready_and_gauge(http, sidecar)
    assert (ready["capture"], gauge) == ("ok", "1.0") and "capture_problem" not in ready


async def test_space_freed_by_moving_rollouts_away_is_used_at_once(http, upstream, start, small_disk, tmp_path):
    """Finished rollouts moved off the disk while the sidecar holds their files open: the next line
    that meets ENOSPC drops the held descriptors, is tried again, and is written."""
    upstream.scripts["/v1/chat/completions"] = json_script(REPLY)
    captures = small_disk / "captures"
    sidecar = await start(upstream.url, capture_dir=str(captures))
    padding = "p" * 16_000
    for index in range(11):
        await fetch(http, "POST", rollout_url(sidecar.url, f"done-{index}", "/v1/chat/completions"),
                    orjson.dumps({"model": "m", "messages": [{"role": "user", "content": padding}]}))
    assert len(list(captures.glob("*.capture.jsonl"))) == 11
    moved = tmp_path / "moved"
    moved.mkdir()
    for path in captures.glob("*.capture.jsonl"):
        shutil.move(str(path), moved / path.name)
    assert free_bytes(small_disk) < 96_000, "held open, the moved files still take their space"
    big = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "q" * 110_000}]})
    reply = await fetch(http, "POST", rollout_url(sidecar.url, "next", "/v1/chat/completions"), big)
    assert reply.status == 200
    lines = (captures / "next.capture.jsonl").read_bytes().splitlines()
    assert len(lines) == 1 and orjson.loads(lines[0])["request"]["messages"][0]["content"] == "q" * 110_000
    assert not (captures / "next.capture.incomplete").exists()


async def test_idle_capture_files_are_closed_so_moving_them_frees_the_disk(http, upstream, start, small_disk, tmp_path,
                                                                           monkeypatch):
    """A rollout's file left without appends is closed (here after 0.2 s): moved away, its space returns."""
    monkeypatch.setattr(open_files, "IDLE_SECONDS", 0.2)
    monkeypatch.setattr(group_commit, "_SWEEP_SECONDS", 0.05)
    upstream.scripts["/v1/chat/completions"] = json_script(REPLY)
    captures = small_disk / "captures"
    sidecar = await start(upstream.url, capture_dir=str(captures))
    for _ in range(100):  # The sidecar's own publication of its calls in flight (a block of its own) first.
        if list(captures.glob("inflight/*.json")):
            break
        await asyncio.sleep(0.02)
    before = free_bytes(small_disk)
    for index in range(4):
        await fetch(http, "POST", rollout_url(sidecar.url, f"r{index}", "/v1/chat/completions"),
                    orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "p" * 20_000}]}))
    moved = tmp_path / "moved"
    moved.mkdir()
    for path in captures.glob("*.capture.jsonl"):
        shutil.move(str(path), moved / path.name)
    for _ in range(100):
        if free_bytes(small_disk) >= before:
            break
        await asyncio.sleep(0.05)
    assert free_bytes(small_disk) >= before


def test_close_idle_closes_only_files_left_idle(tmp_path):
    files = OpenFiles(keep_open=True)
    files.append(str(tmp_path / "a.capture.jsonl"), b"{}\n")
    files.append(str(tmp_path / "b.capture.jsonl"), b"{}\n")
    entry, _ = files.append(str(tmp_path / "b.capture.jsonl"), b"{}\n")
    files.release(entry)
    assert files.close_idle(now=entry.used + open_files.IDLE_SECONDS / 2) == 0
    assert files.close_idle(now=entry.used + open_files.IDLE_SECONDS + 1) == 2 and len(files) == 0
