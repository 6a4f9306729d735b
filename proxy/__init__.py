"""The sidecar: configuration, the proxy application, the CLI (DESIGN §1, §2, §9)."""

from ._app import Sidecar
from ._cli import main
from ._server import RunningServer, start_app, start_sidecar, start_stand_in
from ._settings import ConfigError, Settings, load_settings
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
