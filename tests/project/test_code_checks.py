"""The code is checked by tools, not only described: ruff (correctness rules: pyflakes, pycodestyle's
error classes, bugbear) over the whole checkout, mypy over the three packages with every
``# type: ignore`` narrowed to its error code and saying why (the configuration is pyproject.toml's)."""

from __future__ import annotations

import pytest

import hashlib
import os
import re
import subprocess
import sys
import tempfile

from tests import CHECKOUT

ROOT = CHECKOUT
PACKAGES = ("proxy", "capture", "records")


def test_ruff_finds_nothing():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_finds_nothing():
    # mypy's incremental cache, kept per checkout outside it (a fresh clone at the same place, as CI
    # makes, checks in a second instead of twenty): mypy trusts an entry only while the source's
    # hash matches, so a cache never hides an error.
    checkout = hashlib.sha256(os.path.realpath(ROOT).encode()).hexdigest()[:16]
    cache = os.path.join(os.path.expanduser("~"), ".cache", "model-call-capture", "mypy", checkout)
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError:  # A home that cannot be written: a cold cache of this run's own.
        cache = tempfile.mkdtemp(prefix="mcc-mypy-")
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--cache-dir", cache], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_type_ignore_names_its_error_and_says_why():
    bare = []
    for package in PACKAGES:
        for directory, _, files in os.walk(os.path.join(ROOT, package)):
            for name in files:
                if not name.endswith(".py"):
                    continue
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as handle:
                    for number, line in enumerate(handle, start=1):
                        if "# type: ignore" in line and not re.search(r"# type: ignore\[[-a-z, ]+\]  # \S", line):
                            bare.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}")
    assert not bare, "\n".join(bare)


def test_comments_cite_the_projects_own_docs_never_a_file_a_clone_lacks():
    """The design document lives beside the repository, not in it: code cites docs/ instead."""
    cited = []
    for top in (*PACKAGES, "benchmarks", "deploy"):
        for directory, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith((".py", ".yaml", ".md")):
                    path = os.path.join(directory, name)
                    with open(path, encoding="utf-8") as handle:
                        for number, line in enumerate(handle, start=1):
                            if re.search(r"DESIGN(\.md)? ?§|DESIGN\.md|\.\./shared", line) and "re.sub" not in line:
                                cited.append(f"{os.path.relpath(path, ROOT)}:{number}: {line.strip()}")
    assert not cited, "\n".join(cited)


@pytest.mark.slow
def test_every_benchmark_loads():
    """`make bench` imports what the benchmarks name (a moved name breaks them without a test of theirs)."""
    code = ("import glob, runpy, sys; sys.path[:0] = ['benchmarks', '.']\n"
            "for path in sorted(glob.glob('benchmarks/*.py')):\n"
            "    runpy.run_path(path, run_name='loaded_by_the_suite')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
