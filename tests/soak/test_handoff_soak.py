"""The live hand-off, soaked (`make soak`, not part of `make test`; issue 62): 5,000 rollouts ended
while a checkpointing trainer takes them, the trainer SIGKILLed at random points between take,
ack, checkpoint and commit and restarted from its checkpoint each time: afterwards every ended
rollout is in exactly one step of the checkpoint (none lost, none trained twice)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from records import end_rollout
from records.training import consumer_view

from tests.records.training.test_consumer import _TRAINER, ROOT

pytestmark = pytest.mark.soak
ROLLOUTS = 5_000


def test_a_trainer_killed_again_and_again_trains_5000_rollouts_each_once(tmp_path):
    directory = str(tmp_path / "captures")
    os.makedirs(directory)
    checkpoint = str(tmp_path / "checkpoint.json")
    ids = [f"soak-{n:05d}" for n in range(ROLLOUTS)]
    ending_done = threading.Event()

    def end_them() -> None:  # The agent runners: ends arrive while the trainer runs.
        for rollout_id in ids:
            end_rollout(directory, rollout_id, outcome={"reward": 1.0}, allow_empty=True)
        ending_done.set()

    runner = threading.Thread(target=end_them)
    runner.start()
    kills, attempt = 0, 0
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        attempt += 1
        dies = "dies" if kills < 30 and not ending_done.is_set() else "lives"
        done = subprocess.run([sys.executable, "-c", _TRAINER, ROOT, directory, "trainer", checkpoint, str(attempt), dies],
                              capture_output=True, text=True, timeout=600)
        if done.returncode == -signal.SIGKILL:
            kills += 1
            continue
        assert done.returncode == 0, done.stderr
        if ending_done.is_set() and consumer_view(directory, "trainer").counts()["waiting"] == 0:
            break
    runner.join()
    trained = [rollout_id for _, rollout_id in json.load(open(checkpoint))["trained"]]
    assert len(trained) == len(set(trained)), "none trained twice"
    assert sorted(trained) == ids, "none lost"
    assert kills >= 10
    print(f"\n{ROLLOUTS} rollouts, the trainer killed {kills} times, {attempt} runs")
