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


def test_each_audience_loads_its_own_door_of_the_contract_and_not_the_others():
    """`records.contract` is what writers and readers share; `records.contract.writing` and
    `records.contract.reading` are each one audience's (docs/layout.md)."""
    writer = _loaded_after("import capture.journal")
    assert "records.contract.writing" in writer and "records.contract.reading" not in writer
    for reader in ("import records.store", "import records.training"):
        loaded = _loaded_after(reader)
        assert "records.contract.reading" in loaded and "records.contract.writing" not in loaded, reader


def _contract_names_used(where: str) -> set[str]:
    """The names the modules under ``where`` (outside the contract room) import from `records`,
    `records.contract` or either audience's door."""
    import ast
    from pathlib import Path

    doors = {"records", "records.contract", "records.contract.writing", "records.contract.reading"}
    used: set[str] = set()
    for path in Path(CHECKOUT, where).rglob("*.py"):
        parts = path.relative_to(CHECKOUT).with_suffix("").parts
        if parts[:2] == ("records", "contract"):
            continue
        package = parts[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else ()
                module = ".".join(base + ((node.module,) if node.module else ()))
                if module in doors:
                    used |= {alias.name for alias in node.names}
    return used


def test_the_shared_door_holds_what_both_audiences_use_and_nothing_else():
    import records.contract
    import records.contract.reading
    import records.contract.writing

    shared = set(records.contract.__all__)
    writers = set().union(*(_contract_names_used(room) for room in (
        "capture", "proxy/http", "proxy/call", "proxy/websocket", "proxy/training", "proxy/privacy", "proxy/app")))
    readers = set().union(*(_contract_names_used(room) for room in ("records", "proxy/inspection", "proxy/standin")))
    assert sorted(shared - (writers & readers)) == []
    assert sorted(set(records.contract.writing.__all__) & readers) == []
    assert sorted(set(records.contract.reading.__all__) & writers) == []
    assert not shared & set(records.contract.writing.__all__) and not shared & set(records.contract.reading.__all__)
