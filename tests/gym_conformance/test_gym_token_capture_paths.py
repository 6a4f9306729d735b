"""The Gym tier finds Gym's token-capture modules on either layout (issue 72, point 5): NeMo Gym
0.7.0's ``nemo_gym.token_id_capture`` and its main branch's ``nemo_gym.models.token_capture``.
Each layout is a package made on disk here and imported in a fresh interpreter, as the tier's
scripts run in Gym's venv."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.gym_conformance.gym_token_capture import FINDER


def _layout(root, package: str, source: str = "WHERE = __name__\n") -> None:
    directory = root
    for part in package.split("."):
        directory = directory / part
        directory.mkdir(exist_ok=True)
        (directory / "__init__.py").touch()
    (directory / "store.py").write_text(source)


def _run(root, body: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", FINDER + body], capture_output=True, text=True,
                          env={"PYTHONPATH": str(root)}, timeout=60)


@pytest.mark.parametrize("package", ["nemo_gym.token_id_capture", "nemo_gym.models.token_capture"])
def test_the_module_is_found_on_either_layout(tmp_path, package):
    _layout(tmp_path, package)
    done = _run(tmp_path, "print(gym_token_capture('store').WHERE)")
    assert done.returncode == 0 and done.stdout.strip() == f"{package}.store", done.stderr


def test_a_gym_with_neither_says_where_it_looked(tmp_path):
    (tmp_path / "nemo_gym").mkdir()
    (tmp_path / "nemo_gym" / "__init__.py").touch()
    done = _run(tmp_path, "gym_token_capture('store')")
    assert done.returncode == 1
    assert ("NeMo Gym's token capture module 'store' is in none of nemo_gym.token_id_capture.store, "
            "nemo_gym.models.token_capture.store") in done.stderr


def test_a_module_that_fails_to_import_raises_as_itself(tmp_path):
    _layout(tmp_path, "nemo_gym.token_id_capture", "import no_such_dependency_of_gym\n")
    done = _run(tmp_path, "gym_token_capture('store')")
    assert done.returncode == 1 and "No module named 'no_such_dependency_of_gym'" in done.stderr
