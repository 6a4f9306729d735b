"""The sidecar: configuration, the proxy application, the CLI (docs/layout.md, docs/wire.md, docs/configuration.md).

`import proxy` loads the sidecar, not aiohttp: the stand-in model server's names
(`create_stand_in_app`, `start_app`, `start_stand_in`) load it when first used (PEP 562).
"""

from typing import Any

from ._cli import main
from .app import ConfigError, RunningServer, Settings, Sidecar, load_settings, start_sidecar

#: The names of the stand-in (aiohttp), loaded on first use.
_STAND_IN_NAMES = frozenset({"create_stand_in_app", "start_app", "start_stand_in"})

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
    if name in _STAND_IN_NAMES:
        from . import standin

        return getattr(standin, name)
    raise AttributeError(f"module 'proxy' has no attribute {name!r}")
