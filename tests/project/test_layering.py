"""The direction of dependencies (docs/layout.md) and one public door per package."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest

from tests import CHECKOUT


@pytest.mark.parametrize("package", ["records", "capture"])
def test_package_imports_without_aiohttp(package):
    """A collector imports `records` (and `capture`) without pulling in aiohttp or the proxy."""
    code = (f"import sys, {package}; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('aiohttp', 'proxy', 'multidict', 'yarl')); "
            "print(','.join(bad))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_records_imports_ray_and_pyarrow_only_for_a_dataset():
    """`records` stays pure Python (pydantic + orjson): Ray, pyarrow and numpy come with a dataset."""
    code = ("import sys, records; "
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'pyarrow', 'numpy'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_records_does_not_import_capture():
    code = "import sys, records; print('capture' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("package", ["records", "capture", "proxy"])
def test_every_exported_name_exists(package):
    module = __import__(package)
    assert len(set(module.__all__)) == len(module.__all__)
    for name in module.__all__:
        assert hasattr(module, name), f"{package}.{name} is exported but missing"


def test_every_package_door_is_pinned():
    """What each package exports is decided, not drifted into: a name added to or dropped from a
    door's ``__all__`` changes tests/project/doors.json in the same commit (regenerate it with
    ``python -c "import tests.project.test_layering as t; t.write_doors()"`` and review the diff)."""
    with open(_DOORS_FILE, encoding="utf-8") as handle:
        pinned = json.load(handle)
    assert sorted(pinned) == sorted(_doors()), "a package door is missing from tests/project/doors.json (or one is gone)"
    for door, names in pinned.items():
        assert sorted(importlib.import_module(door).__all__) == names, f"{door}.__all__ differs from tests/project/doors.json"


_DOORS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "doors.json")


def _doors() -> list[str]:
    """Every package of the three (a directory with an ``__init__.py``), by dotted name."""
    root = CHECKOUT
    found = []
    for top in ("proxy", "capture", "records"):
        for directory, _, files in os.walk(os.path.join(root, top)):
            if "__init__.py" in files and "__pycache__" not in directory:
                found.append(os.path.relpath(directory, root).replace(os.sep, "."))
    return sorted(found)


def write_doors() -> None:
    doors = {door: sorted(importlib.import_module(door).__all__) for door in _doors()}
    with open(_DOORS_FILE, "w", encoding="utf-8") as handle:
        json.dump(doors, handle, indent=1, sort_keys=True)
        handle.write("\n")


def test_import_capture_loads_the_parsers_only():
    """`import capture` is the parsers: no journal (its process and socket code), no records, no
    socket or process modules; the writer is `capture.journal`, behind its own door."""
    code = ("import sys, capture; "
            "print(','.join(sorted(m for m in sys.modules if m.startswith(('capture.journal', 'records', 'socket', "
            "'subprocess', 'multiprocessing', 'aiohttp')))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
