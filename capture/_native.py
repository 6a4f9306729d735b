"""Which per-event core runs: the compiled one (capture/_core.c) or the pure-Python reference.

The compiled core does what runs once per streamed event -- framing a read of plain SSE events,
matching a run of events against a learnt template, writing a run back -- in C. The Python code
it stands in for stays where it is (capture/_sse.py, capture/_event_templates.py): it is the
reference the core is tested against, bit for bit, and the fallback wherever the core is not
there. The pattern is aiohttp's (``AIOHTTP_NO_EXTENSIONS``), yarl's and multidict's: built by pip
with the machine's compiler when it can be, never required (docs/speed.md, "The compiled core").

``MCC_NO_EXTENSIONS=1`` selects the pure Python. The callers read `core` at each call (one
attribute, once per read or run, never per event), so that a test can run the same code on both
(`select`).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Optional

#: The environment variable that selects the pure-Python reference, as aiohttp's does.
NO_EXTENSIONS_VARIABLE = "MCC_NO_EXTENSIONS"
#: The extension pip builds from capture/_core.c (pyproject.toml's ext-modules).
_CORE_MODULE = "capture._core"


def _load() -> tuple[Optional[ModuleType], str]:
    if os.environ.get(NO_EXTENSIONS_VARIABLE, "").strip().lower() not in ("", "0", "false", "no"):
        return None, f"pure Python ({NO_EXTENSIONS_VARIABLE} is set)"
    try:
        return importlib.import_module(_CORE_MODULE), "compiled"
    except ImportError as exc:
        return None, f"pure Python (the compiled core is not built: {exc}; see docs/speed.md)"


#: The compiled core's module, or None where the pure Python runs.
core, _description = _load()


def description() -> str:
    """What runs, in the words the start-up log and ``/-/ready`` use: ``compiled`` or why not."""
    return _description


def select(compiled: bool) -> None:
    """Run the compiled core (True) or the pure-Python reference (False) from now on, in this
    process: the tests' switch, to hold both to the same outputs."""
    global core, _description
    if compiled:
        core = importlib.import_module(_CORE_MODULE)
        _description = "compiled"
    else:
        core = None
        _description = "pure Python (selected)"
