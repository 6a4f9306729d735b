"""Guards of the layout (docs/layout.md, issue 43): read from the code's own imports, as text.

- every module of `proxy`, `capture` and `records` imports alone, in a fresh interpreter;
- no import circle between modules (every import counts: at the top, in a function, under
  ``TYPE_CHECKING``: a circle hidden in a function is still a circle of the design);
- no package imports another package's private module (a path with a ``_`` component that is not
  inside the importer's own top-level package); tests may, through `TESTS_MAY_IMPORT`;
- `capture`'s parsers open no file, socket or process: only `capture/journal/` does I/O;
- inside `proxy/`, the layers import downward only: http <- call <- websocket <- training <- app;
- `import proxy` imports no aiohttp (the stand-in and `start_app` load it when first used).

Each allowlist holds today's violations and may only shrink: a new entry is a design decision to
argue in review, not a fix for a red test.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests import CHECKOUT

ROOT = Path(CHECKOUT)
PACKAGES = ("proxy", "capture", "records")

#: Circles allowed to remain (each a sorted tuple of the modules in one strongly connected set).
CIRCLES_ALLOWED: set[tuple[str, ...]] = set()
#: (importer, imported) pairs of a private module of another package, allowed to remain.
PRIVATE_IMPORTS_ALLOWED: set[tuple[str, str]] = set()
#: The private modules tests may import (white-box tests of a unit that has no public door).
TESTS_MAY_IMPORT = {
    "capture._event_templates",
    "capture._native",  # select: a test runs on the compiled core and on the Python (tests/conftest.py)
    "capture._sse",  # plain_events, the compiled core's reference
    "capture._tap",  # first_of, split_events: the compiled core's references
    "capture.journal._group_commit",
    "capture.journal._open_files",
    "capture.journal._process_client",
    "capture.journal._process_main",
    "capture.journal._writer",
    "proxy.app._workers",
    "records.store._store",
    "records.training._datasets",
}
#: Modules of `capture` that may touch the disk, sockets or processes.
CAPTURE_IO = "capture.journal"
IO_MODULES = {"socket", "subprocess", "fcntl", "mmap", "multiprocessing", "shutil", "tempfile"}
#: The layers of `proxy`, lowest first: a layer imports only those before it (and other packages).
PROXY_LAYERS = ("proxy.http", "proxy.call", "proxy.websocket", "proxy.training", "proxy.privacy", "proxy.app")


def module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = module_files()


def imports_of(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports, anywhere in its text."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # ``from x import y``: y may be a module of x, else a name defined in x.
            targets = [f"{stem}.{alias.name}" if f"{stem}.{alias.name}" in MODULES else stem for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]  # ``import a.b.c`` of a name: its module.
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def circles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Strongly connected sets of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.add(tuple(sorted(members)))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def is_private_to_others(importer: str, imported: str) -> bool:
    """``imported`` has a private component (``_name``) whose package the importer is not in: a
    private module is its own package's (``proxy.http._checks`` is ``proxy.http``'s), whatever
    top-level package the importer is in."""
    parts = imported.split(".")
    for position, part in enumerate(parts[1:], start=1):
        if part.startswith("_") and not part.startswith("__"):
            owner = ".".join(parts[:position])
            return not _in_package(importer, owner)
    return False


#: Imports each module named on stdin with every module of the project dropped first (so each is
#: imported alone: an import cycle or a missing import shows), in one interpreter per half of them
#: (a fresh interpreter per module cost half a minute; third-party packages stay loaded).
_IMPORT_ALONE = """
import importlib, sys, traceback
for name in sys.stdin.read().split():
    for loaded in [m for m in sys.modules if m.split(".")[0] in ("proxy", "capture", "records")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException:
        print(name, traceback.format_exc().strip().splitlines()[-1])
"""


@pytest.mark.slow
def test_every_module_imports_alone():
    def load(names: list[str]) -> list[str]:
        done = subprocess.run([sys.executable, "-c", _IMPORT_ALONE], input="\n".join(names), capture_output=True,
                              text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip().splitlines()

    names = sorted(name for name in MODULES if not name.endswith("__main__"))
    with ThreadPoolExecutor(2) as pool:
        failed = [line for lines in pool.map(load, [names[0::2], names[1::2]]) for line in lines]
    assert failed == []


def test_no_import_circles():
    assert circles(GRAPH) - CIRCLES_ALLOWED == set()
    assert CIRCLES_ALLOWED - circles(GRAPH) == set(), "a circle allowed is gone: shrink CIRCLES_ALLOWED"


def test_no_package_imports_another_packages_private_module():
    found = {(importer, imported) for importer, targets in GRAPH.items() for imported in targets
             if is_private_to_others(importer, imported)}
    assert found - PRIVATE_IMPORTS_ALLOWED == set()
    assert PRIVATE_IMPORTS_ALLOWED - found == set(), "an allowed private import is gone: shrink the list"


def test_tests_import_private_modules_only_from_their_short_list():
    used = set()
    for path in sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                if name.split(".")[0] in PACKAGES and any(part.startswith("_") for part in name.split(".")[1:]):
                    used.add((path.relative_to(ROOT).as_posix(), name))
    assert {name for _, name in used} - TESTS_MAY_IMPORT == set(), sorted(used)


def test_capture_parsers_do_no_io():
    offenders = []
    for name, path in MODULES.items():
        if not _in_package(name, "capture") or _in_package(name, CAPTURE_IO):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                offenders += [(name, module) for module in names if module.split(".")[0] in IO_MODULES]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
                offenders.append((name, "open()"))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and isinstance(node.func.value, ast.Name) and node.func.value.id == "os"):
                offenders.append((name, f"os.{node.func.attr}()"))
    assert offenders == []


@pytest.mark.parametrize("layer", PROXY_LAYERS)
def test_proxy_layers_import_downward_only(layer):
    above = PROXY_LAYERS[PROXY_LAYERS.index(layer) + 1:]
    upward = sorted((importer, imported) for importer, targets in GRAPH.items() if _in_package(importer, layer)
                    for imported in targets if any(_in_package(imported, higher) for higher in above)
                    or _in_package(imported, "proxy.standin") or _in_package(imported, "proxy.inspection"))
    assert upward == []


#: The rooms of `records` (docs/layout.md), each importing only those before it.
RECORDS_ROOMS = ("records.contract", "records.store", "records.training")


@pytest.mark.parametrize("room", RECORDS_ROOMS)
def test_records_rooms_import_downward_only(room):
    """contract <- store <- training; no room imports the readers' door (`records` itself)."""
    allowed = RECORDS_ROOMS[:RECORDS_ROOMS.index(room) + 1]
    outward = sorted((importer, imported) for importer, targets in GRAPH.items() if _in_package(importer, room)
                     for imported in targets if _in_package(imported, "records")
                     and not any(_in_package(imported, ok) for ok in allowed))
    assert outward == []


@pytest.mark.parametrize("writer", ["capture.journal", "proxy.training"])
def test_the_writers_import_the_records_contract_only(writer):
    """What the sidecar writes and readers read is agreed in `records.contract`: the writers never
    lean on a reader's module."""
    beyond = sorted((importer, imported) for importer, targets in GRAPH.items() if _in_package(importer, writer)
                    for imported in targets if _in_package(imported, "records") and not _in_package(imported, "records.contract"))
    assert beyond == []


def test_the_wire_imports_nothing_else_of_the_project():
    outside = sorted((importer, imported) for importer, targets in GRAPH.items() if _in_package(importer, "proxy.http")
                     for imported in targets if not _in_package(imported, "proxy.http"))
    assert outside == []


def test_app_never_depends_on_the_stand_in():
    found = sorted((importer, imported) for importer, targets in GRAPH.items() if _in_package(importer, "proxy.app")
                   for imported in targets if _in_package(imported, "proxy.standin"))
    assert found == []


def test_import_proxy_imports_no_aiohttp():
    code = "import sys, proxy; print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'aiohttp')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert done.stdout.strip() == ""


def test_the_guards_read_what_they_guard():
    """The guards can fail: the graph they read has the project's real imports and circles."""
    assert "records.contract" in GRAPH["capture.journal._group_commit"]
    assert is_private_to_others("proxy.app._sidecar", "proxy.http._checks")
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {("a", "b", "c")}
    assert is_private_to_others("proxy.inspection.tables", "records.store._shapes")
    assert not is_private_to_others("records.store", "records.store._shapes")
    assert os.path.isdir(ROOT / "capture" / "journal")
