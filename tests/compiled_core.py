"""Whether this machine has the compiled per-event core (capture/_core.c, docs/speed.md): `make
install` builds it wherever there is a C compiler. A test that needs it fails where a compiler is
there and the core is not (a broken build), and skips, saying why, on a machine without one (the
install then runs the pure-Python reference, which the suite tests as ever)."""

from __future__ import annotations

import importlib
import shlex
import shutil
import sysconfig

import pytest


def has_c_compiler() -> bool:
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc") or ["cc"]
    return shutil.which(compiler[0]) is not None


def require_compiled_core() -> None:
    """Fail (a compiler is here, the core did not build) or skip (no compiler) unless the core loads."""
    try:
        importlib.import_module("capture._core")
    except ImportError as exc:
        if has_c_compiler():
            pytest.fail(f"the compiled core is not built ({exc}), and this machine has a C compiler: "
                        "`make install` builds it (see pip's output)")
        pytest.skip("no C compiler on this machine: the compiled core is not built (the pure-Python reference is tested)")
