"""``mcc serve --workers`` and shutdown under the faults an SRE meets (issue 30, points 11-13): a
read-only /tmp in a private mount namespace, replacements that die or hang while starting, and a
second signal during ``--shutdown-delay``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import proxy.app._workers as workers
from tests.processes import read_line

MCC = [sys.executable, "-m", "proxy"]


def _unshare_prefix() -> list[str]:
    """A private mount namespace: as root directly, else as the root of a user namespace."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed: the read-only /tmp test needs a private mount namespace")
    prefix = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
    if subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a private mount namespace here (unshare -m refused)")
    return prefix


#: Inside the namespace: /tmp, /var/tmp and /dev/shm read-only, the working directory too (it is
#: under /tmp), TMPDIR unset: `tempfile.gettempdir()` finds nothing. The capture dir is a tmpfs.
_READ_ONLY_TMP = """
set -e
mount --make-rprivate /
for dir in /tmp /var/tmp /dev/shm; do
  if [ -d "$dir" ]; then mount --bind "$dir" "$dir"; mount -o remount,bind,ro "$dir"; fi
done
cd "$RO_CWD"
if [ -n "$CAPTURE_DIR" ]; then mount -t tmpfs -o size=4m tmpfs "$CAPTURE_DIR"; fi
unset TMPDIR TEMP TMP
exec "$@"
"""


def _serve_in_read_only_tmp(tmp_path, capture: bool) -> subprocess.Popen:
    capture_dir = tmp_path / "captures"
    capture_dir.mkdir()
    args = ["serve", "--stand-in", "--port", "0", "--workers", "2"]
    if capture:
        args += ["--capture-dir", str(capture_dir)]
    env = {**os.environ, "RO_CWD": str(tmp_path), "CAPTURE_DIR": str(capture_dir) if capture else ""}
    return subprocess.Popen([*_unshare_prefix(), "sh", "-c", _READ_ONLY_TMP, "sh", *MCC, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_workers_serve_with_a_read_only_tmp_from_the_next_writable_dir(tmp_path):
    """``tempfile.gettempdir()`` raises when /tmp, /var/tmp and the working directory are read-only:
    the candidates after it (/dev/shm, the capture dir) are still tried, and the workers serve."""
    process = _serve_in_read_only_tmp(tmp_path, capture=True)
    try:
        line = read_line(process.stdout, timeout=60)
        assert line.startswith("listening on "), (line, process.stderr.read() if process.poll() is not None else "")
        with urllib.request.urlopen(line.split()[-1] + "/-/metrics", timeout=30) as reply:
            assert b'mcc_worker_info{' in reply.read()
    finally:
        process.terminate()
        code = process.wait(timeout=60)
    assert code == 0, process.stderr.read()


def test_workers_without_any_writable_dir_say_so_in_one_sentence(tmp_path):
    process = _serve_in_read_only_tmp(tmp_path, capture=False)
    code = process.wait(timeout=60)
    stderr = process.stderr.read()
    assert code == 2 and "Traceback" not in stderr, stderr
    assert "needs a writable directory for the workers' metrics" in stderr and "/dev/shm" in stderr


def _start_workers(tmp_path, *extra: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([*MCC, "serve", "--stand-in", "--port", "0", "--workers", "2", *extra],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return process, read_line(process.stdout, timeout=60).split()[-1]


def _worker_pids(url: str) -> list[int]:
    with urllib.request.urlopen(url + "/-/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return sorted(int(line.split('"')[1]) for line in text.splitlines() if line.startswith("mcc_worker_info{"))


@pytest.mark.slow
def test_replacements_that_die_while_starting_count_towards_the_crash_loop(tmp_path):
    """The capture dir becomes a file (a broken volume): every replacement exits 2 while starting.
    Each is one death; the supervisor gives up at the fifth, with the real exit statuses."""
    captures = tmp_path / "captures"
    captures.mkdir()
    process, url = _start_workers(tmp_path, "--capture-dir", str(captures))
    try:
        victim = _worker_pids(url)[0]
        captures.rename(tmp_path / "moved")
        captures.write_text("not a directory")
        os.kill(victim, signal.SIGKILL)
        code = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    stderr = process.stderr.read()
    assert code == 1, stderr
    assert "5 deaths in 60s, giving up" in stderr, stderr
    assert stderr.count("died (exit 2) while starting") >= 3 and "exit None" not in stderr, stderr


@pytest.mark.slow
def test_a_replacement_hung_while_starting_does_not_hide_other_deaths(tmp_path):
    """The config file becomes a FIFO nobody writes (a hung mount): a replacement blocks reading it.
    Meanwhile the other worker's death is noticed, logged and replaced at once."""
    config = tmp_path / "mcc.yaml"
    config.write_text("mcc:\n  drain_timeout: 5\n")
    process, url = _start_workers(tmp_path, "--config", str(config))
    try:
        first, second = _worker_pids(url)
        config.unlink()
        os.mkfifo(config)
        os.kill(first, signal.SIGKILL)
        time.sleep(1.0)  # Its replacement is now stuck opening the FIFO.
        os.kill(second, signal.SIGKILL)
        deadline = time.monotonic() + 30
        seen = ""
        while time.monotonic() < deadline and f"(pid {second}) died (signal 9)" not in seen:
            seen += read_line(process.stderr, timeout=30) + "\n"
        assert f"(pid {second}) died (signal 9)" in seen and f"(pid {first}) died (signal 9)" in seen, seen
    finally:
        process.terminate()
        process.wait(timeout=60)


def test_a_worker_not_ready_in_time_is_killed_and_counted(monkeypatch):
    """A real process that never prints its ready line is taken for hung after START_TIMEOUT_S."""
    monkeypatch.setattr(workers, "START_TIMEOUT_S", 0.3)
    worker = workers._Worker([sys.executable, "-c", "import time; time.sleep(60)"], 1)
    assert workers._death(worker) is None
    time.sleep(0.5)
    how = workers._death(worker)
    assert how is not None and "not ready within 0.3s" in how
    assert worker.process.poll() is not None


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_cuts_the_shutdown_delay(second):
    """SIGTERM starts a 600 s --shutdown-delay (/-/ready says 503); a second SIGTERM or Ctrl-C drains now."""
    process = subprocess.Popen([*MCC, "serve", "--stand-in", "--port", "0", "--shutdown-delay", "600"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = read_line(process.stdout, timeout=60).split()[-1]
        process.send_signal(signal.SIGTERM)
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/-/ready", timeout=5)
            except urllib.error.HTTPError as exc:
                assert exc.code == 503
                break
            time.sleep(0.05)
        else:
            raise AssertionError("/-/ready never said 503 during the shutdown delay")
        process.send_signal(second)
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0
    assert "the shutdown delay is cut" in process.stderr.read()


def test_a_shutdown_delay_past_an_hour_is_refused():
    done = subprocess.run([*MCC, "serve", "--stand-in", "--shutdown-delay", "1e9"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--shutdown-delay" in done.stderr and "3600" in done.stderr
    assert "Traceback" not in done.stderr
