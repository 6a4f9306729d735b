"""The direction of dependencies (DESIGN §1) and one public door per package."""

from __future__ import annotations

import subprocess
import sys

import pytest


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
