"""The sidecar: configuration, the proxy application, the CLI (DESIGN §1, §2, §9)."""

from .app._sidecar import Sidecar
from ._cli import main
from .app._serve import RunningServer, start_app, start_sidecar, start_stand_in
from .app._settings import ConfigError, Settings, load_settings
from .standin import create_stand_in_app

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
