"""A separate, cached virtualenv with NeMo Gym 0.7.0, the reference reader (issue 14).

Gym declares Python >= 3.13.14 and pulls ray, mlflow and friends (1.4 GB, about 90 s to install
here), so it never enters the project's own environment. The venv is built once per machine in
``$MCC_GYM_VENV`` (default ``~/.cache/model-call-capture/nemo-gym-0.7.0``) with the newest
Python 3.13 found, installed with ``--ignore-requires-python`` when that Python is older than
3.13.14 (Gym's reader runs on 3.13.0). A stamp file marks a finished install.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import subprocess

GYM_REQUIREMENT = "nemo-gym==0.7.0"
VENV = os.environ.get("MCC_GYM_VENV") or os.path.expanduser("~/.cache/model-call-capture/nemo-gym-0.7.0")
_STAMP = os.path.join(VENV, ".installed")


class GymUnavailable(Exception):
    """No Python 3.13 here, or the install failed; the message says which and why."""


def gym_python() -> str:
    """The venv's interpreter, building the venv first when it is missing. One builder at a time:
    pytest-xdist's workers each ask at once on a fresh machine, and a second builder would remove
    the venv the first is installing into (seen: "No module named 'orjson'" in Gym's reader)."""
    python = os.path.join(VENV, "bin", "python")
    if os.path.exists(_STAMP):
        return python
    os.makedirs(os.path.dirname(VENV), exist_ok=True)
    with open(VENV + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # Released when the file closes, also when this process dies.
        if os.path.exists(_STAMP):  # Another worker built it while this one waited.
            return python
        return _build(python)


def _build(python: str) -> str:
    base = _python313()
    shutil.rmtree(VENV, ignore_errors=True)
    _run([base, "-m", "venv", VENV], "create the venv")
    _run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--ignore-requires-python",
          GYM_REQUIREMENT], f"pip install {GYM_REQUIREMENT}")
    with open(_STAMP, "w", encoding="ascii") as handle:
        handle.write(GYM_REQUIREMENT + "\n")
    return python


def _python313() -> str:
    candidates = [shutil.which("python3.13") or ""]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.13*/bin/python3.13")), reverse=True)
    candidates += ["/usr/bin/python3.13", "/usr/local/bin/python3.13"]
    for candidate in candidates:
        if candidate and os.path.exists(candidate):
            done = subprocess.run([candidate, "-c", "import sys; print(sys.version_info >= (3, 13))"],
                                  capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.strip() == "True":
                return candidate
    raise GymUnavailable("no Python 3.13 interpreter found (NeMo Gym 0.7.0 declares >= 3.13.14; an earlier 3.13 "
                         "works with --ignore-requires-python, as this venv is installed)")


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise GymUnavailable(f"could not {what}: {tail}")
