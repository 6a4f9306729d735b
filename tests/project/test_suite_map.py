"""tests/README.md maps the suite: each folder it lists exists and holds tests, every test folder is
listed, and every test file the user docs name exists."""

from __future__ import annotations

import os
import re

from tests import CHECKOUT

TESTS = os.path.join(CHECKOUT, "tests")


def _mapped() -> list[str]:
    with open(os.path.join(TESTS, "README.md"), encoding="utf-8") as handle:
        return re.findall(r"^\| `([a-z0-9_/]+)/` \|", handle.read(), flags=re.M)


def test_every_folder_the_map_lists_holds_tests_and_every_test_folder_is_listed():
    mapped = _mapped()
    assert mapped, "tests/README.md lists no folder"
    holding = set()
    for directory, _, files in os.walk(TESTS):
        if "__pycache__" in directory or os.path.samefile(directory, TESTS):
            continue
        if any(name.startswith("test_") and name.endswith(".py") for name in files):
            holding.add(os.path.relpath(directory, TESTS).replace(os.sep, "/"))
    assert sorted(set(mapped) - holding) == [], "listed in tests/README.md, but no tests there"
    assert sorted(holding - set(mapped)) == [], "test folders missing from tests/README.md"
    top = [name for name in os.listdir(TESTS) if name.startswith("test_") and name.endswith(".py")]
    assert top == [], "a test file at the top of tests/: put it in the folder of what it tests"


def test_every_test_file_the_docs_name_exists():
    named = set()
    for path in [os.path.join(CHECKOUT, "README.md"), os.path.join(CHECKOUT, "deploy", "README.md"),
                 *(os.path.join(CHECKOUT, "docs", name) for name in os.listdir(os.path.join(CHECKOUT, "docs")))]:
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                named.update(re.findall(r"tests/[A-Za-z0-9_/]+\.py", handle.read()))
    assert named, "the docs name no test file"
    assert sorted(path for path in named if not os.path.exists(os.path.join(CHECKOUT, path))) == []
