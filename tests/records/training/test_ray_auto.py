"""``mcc export --ray auto`` where no cluster answers (issue 30, point 14): the address ``auto``
stands for is reached first, as a named one is, and Ctrl-C ends a connect Ray would retry for
minutes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.interop.servers import free_port

pytest.importorskip("ray", reason="Ray Data is the optional extra model-call-capture[ray] (make install has it)")

MCC = os.path.join(os.path.dirname(sys.executable), "mcc")


def _export(tmp_path, ray: str, **env: str) -> subprocess.Popen:
    captures = tmp_path / "captures"
    captures.mkdir(exist_ok=True)
    clean = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    return subprocess.Popen([MCC, "export", str(captures), "--format", "parquet", "--ray", ray, "-o",
                             str(tmp_path / "out")], env={**clean, "RAY_TMPDIR": str(tmp_path), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_auto_with_a_dead_sessions_address_says_so_at_once(tmp_path):
    """A `ray start` killed, not stopped, leaves its address in ray_current_cluster: one sentence, exit 2."""
    (tmp_path / "ray").mkdir()
    port = free_port()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{port}\n")
    process = _export(tmp_path, "auto")
    code = process.wait(timeout=120)
    stderr = process.stderr.read()
    assert code == 2, stderr
    assert stderr.startswith("mcc: cannot reach the Ray cluster at auto (") and f":{port}, the address it finds)" in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_auto_through_ray_address_is_reached_first(tmp_path):
    port = free_port()
    process = _export(tmp_path, "auto", RAY_ADDRESS=f"127.0.0.1:{port}")
    assert process.wait(timeout=120) == 2
    assert process.stderr.read().startswith("mcc: cannot reach the Ray cluster at auto (")


def test_auto_with_no_cluster_anywhere_says_so(tmp_path):
    if subprocess.run(["pgrep", "-f", "gcs_server"], capture_output=True).returncode == 0:
        pytest.skip("a Ray cluster runs on this machine: `auto` would find it")
    process = _export(tmp_path, "auto")
    assert process.wait(timeout=120) == 2
    assert process.stderr.read().startswith("mcc: no running Ray cluster found for --ray auto")


@pytest.mark.slow
def test_ctrl_c_ends_a_connect_that_hangs(tmp_path):
    """An address that accepts connections and never answers (a cluster mid-restart): Ray retries;
    Ctrl-C (SIGINT) ends the command."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    try:
        process = _export(tmp_path, f"127.0.0.1:{listener.getsockname()[1]}")
        time.sleep(3)  # Past the reachability check, inside ray.init.
        assert process.poll() is None, process.stderr.read()
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise AssertionError("Ctrl-C did not end `mcc export --ray` while it connected") from None
        assert code != 0
    finally:
        listener.close()


@pytest.mark.slow
def test_ray_says_no_info_lines_in_an_export(tmp_path):
    """Issue 33, point 9: Ray's INFO lines (connecting, its dashboard, each dataset's plan) are not
    the command's output: `mcc export --ray local` prints its own line, and warnings only."""
    from tests.capture_dirs import make_capture_dir
    captures = tmp_path / "captures"
    make_capture_dir(str(captures), rollouts=2, calls=3)
    clean = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    done = subprocess.run([MCC, "export", str(captures), "--format", "parquet", "--ray", "local", "-o",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300, env=clean)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("6 rows")
    assert " INFO " not in done.stdout + done.stderr, done.stderr
