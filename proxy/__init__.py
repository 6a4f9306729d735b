"""The sidecar: configuration, the proxy application, the CLI (docs/layout.md, docs/wire.md, docs/configuration.md).

The door is lazy (PEP 562): each name is imported from its module on first use. `import proxy`
loads nothing else, and importing one room (`proxy.training._token_line`, which the capture
process imports to build the token mode's lines: `capture.journal.Job`) does not load the CLI,
the application and the stand-in (aiohttp) with it. The imports below are what a type checker and
a reader of this file see.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._cli import main
    from .app import ConfigError, RunningServer, Settings, Sidecar, load_settings, start_sidecar
    from .standin import create_stand_in_app, start_app, start_stand_in

#: Each name of the door, and the module it is imported from on first use.
_MODULES = {
    "main": "._cli",
    **{name: ".app" for name in ("ConfigError", "RunningServer", "Settings", "Sidecar", "load_settings", "start_sidecar")},
    **{name: ".standin" for name in ("create_stand_in_app", "start_app", "start_stand_in")},
}

__all__ = [
    "ConfigError",
    "RunningServer",
    "Settings",
    "Sidecar",
    "create_stand_in_app",
    "load_settings",
    "main",
    "start_app",
    "start_sidecar",
    "start_stand_in",
]


def __getattr__(name: str) -> Any:
    import importlib

    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'proxy' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # Found once: the next use is a plain attribute.
    return value
