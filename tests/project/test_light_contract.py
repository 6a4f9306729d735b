"""`records.contract` is a light door for writers (issue 75): importing it, or `capture.journal` (the
sidecar's writer), loads the contract room and none of the readers behind `records` -- counted in a
fresh interpreter, by the modules loaded, never by time. The `records` door stays whole for users:
every name of it is there on first use."""

from __future__ import annotations

import json
import subprocess
import sys

from tests import CHECKOUT

_READER_ROOMS = ("records.store", "records.training", "records._captures", "records._reference")


def _loaded_after(statement: str) -> list[str]:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=CHECKOUT, check=True)
    return json.loads(done.stdout)


def test_importing_the_contract_or_the_writer_loads_no_reader_module():
    for statement in ("import records.contract", "import capture.journal"):
        loaded = _loaded_after(statement)
        ours = [name for name in loaded if name == "records" or name.startswith("records.")]
        assert [name for name in ours if name.startswith(_READER_ROOMS)] == [], statement
        assert all(name in ("records", "records.contract") or name.startswith("records.contract.") for name in ours), ours


def test_the_readers_door_is_whole_on_first_use():
    loaded = _loaded_after("import records; [getattr(records, name) for name in records.__all__]")
    assert "records.training._consumer" in loaded and "records.store._store" in loaded
    import records

    assert set(records.__all__) <= set(dir(records))
    assert records.Consumer.__module__ == "records.training._consumer"
