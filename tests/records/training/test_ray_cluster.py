"""`records.ray_dataset` and `mcc export --ray` on an existing Ray cluster, started with
deploy/README.md's commands (issue 24, point 2).

A head (`ray start --head`) and a second node (`ray start --address`), each with one CPU, are
started here on one machine as on two: each its own raylet and workers, both with token
authentication (Ray 2.60's `ray start --head` turns it on) and the cluster's token in the
environment, as the README says to give it. The driver is a process of its own that connects by
address, as a user's job does, and nothing puts this checkout on the workers' path: they import
`records` from the installed package, as on a cluster's nodes.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.capture_dirs import make_token_dir
from tests.interop.servers import free_port, wait_for_port
from tests.records.training.test_ray_dataset import expected_token_rows

pytest.importorskip("ray", reason="Ray Data is the optional extra model-call-capture[ray] (make install has it)")
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
MCC = os.path.join(os.path.dirname(sys.executable), "mcc")

#: The driver a user runs on a cluster: the README's training rows, written as Parquet, and which
#: nodes read them (a read task's node, through a map fused into it).
DRIVER = """
import json, sys, time
import pyarrow as pa
import ray
from records import ray_dataset

address, directory, output = sys.argv[1:4]
ray.init(address=address, log_to_driver=False, logging_level="ERROR")
deadline = time.monotonic() + 60
while sum(node["Alive"] for node in ray.nodes()) < 2:
    if time.monotonic() > deadline:
        sys.exit("the second node did not join")
    time.sleep(0.2)

def with_node(batch):
    return batch.append_column("node", pa.array([ray.get_runtime_context().get_node_id()] * batch.num_rows))

tokens = ray_dataset(directory, kind="tokens", target_bytes_per_task=40_000)
tokens.filter(lambda row: row["usable"] and row["drift_at"] is None).write_parquet(output)
nodes = tokens.map_batches(with_node, batch_format="pyarrow").unique("node")
print(json.dumps({"nodes": len(nodes), "cluster_nodes": len(ray.nodes())}))
"""


def _stop(process: subprocess.Popen) -> None:
    """A `ray start --block` and everything it started (its own session): SIGTERM, then SIGKILL,
    which its gcs_server needs (it outlives a SIGTERM: waiting longer for it only slows the suite)."""
    for sig, wait in ((signal.SIGTERM, 2), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:  # The whole session is gone.
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait)


@pytest.fixture(scope="module")
def ray_cluster():
    """(address, environment of a machine that holds the cluster's token)."""
    if not os.path.exists(RAY):
        pytest.skip(f"no {RAY}: Ray's command line comes with the ray extra")
    # A short root: Ray puts Unix sockets under it. Its own, so that /tmp/ray/ray_current_cluster,
    # which a bare ray.init() would connect to, is never written.
    root = tempfile.mkdtemp(prefix="mccray", dir="/tmp")
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32), PYTHONPATH="")
    port = free_port()
    common = ["--num-cpus", "1", "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
              "--object-store-memory", str(100 * 1024 * 1024), "--temp-dir", root, "--block"]
    started = []
    try:
        for name, args in (("head", ["--head", "--port", str(port), "--include-dashboard", "false"]),
                           ("node", ["--address", f"127.0.0.1:{port}"])):
            log = os.path.join(root, f"{name}.log")
            with open(log, "wb") as out:
                started.append(subprocess.Popen([RAY, "start", *args, *common], env=env, stdout=out,
                                                stderr=subprocess.STDOUT, start_new_session=True))
            if name == "head":
                try:
                    wait_for_port(port, started[0], timeout=60)
                except RuntimeError as exc:
                    pytest.fail(f"ray start --head: {exc}:\n{open(log).read()[-3000:]}")
        yield f"127.0.0.1:{port}", env
    finally:
        for process in reversed(started):
            _stop(process)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_a_driver_on_an_existing_cluster_reads_across_its_nodes(tmp_path, ray_cluster):
    """The README's training rows from a driver that joins the cluster by address; both nodes read."""
    import pyarrow.parquet as pq

    address, env = ray_cluster
    directory = str(tmp_path / "captures")
    make_token_dir(directory, rollouts=24, calls=3, tokens=50)
    done = subprocess.run([sys.executable, "-c", DRIVER, address, directory, str(tmp_path / "training")],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"nodes": 2, "cluster_nodes": 2}
    table = pq.read_table(str(tmp_path / "training"))
    expected = [row for row in expected_token_rows(directory) if row["usable"] and row["drift_at"] is None]
    assert table.num_rows == len(expected) > 0
    assert (sorted(table.column("generation_token_ids").to_pylist())
            == sorted(row["generation_token_ids"] for row in expected))


@pytest.mark.slow
def test_mcc_export_on_an_existing_cluster_and_its_errors(tmp_path, ray_cluster):
    """`mcc export --ray host:port` as deploy/README shows it, and one sentence, at once, for a
    cluster that is not there."""
    import pyarrow.parquet as pq

    address, env = ray_cluster
    directory = str(tmp_path / "captures")
    make_token_dir(directory, rollouts=6, calls=3, tokens=20)
    output = str(tmp_path / "calls")
    done = subprocess.run([MCC, "export", directory, "--format", "parquet", "--ray", address, "-o", output],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    # 6 rollouts of 3 calls, and rollout 4's retried attempt.
    assert done.stdout.strip().endswith(f"{6 * 3 + 3:,} rows") and pq.read_table(output).num_rows == 6 * 3 + 3

    nowhere = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    refused = subprocess.run([MCC, "export", directory, "--format", "parquet", "--ray", nowhere, "-o", str(tmp_path / "x")],
                             env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and time.monotonic() - started < 60
    assert refused.stderr.startswith(f"mcc: cannot reach the Ray cluster at {nowhere}:") and "ray start --head" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
