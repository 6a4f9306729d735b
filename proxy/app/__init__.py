"""The process (docs/layout.md, docs/configuration.md): `Sidecar` (admin endpoints, readiness, lifecycle), its settings,
logging, workers, and serving it. It makes the `proxy.call.CallContext`; each feature declares its
options, metrics, hooks and drain (`proxy.app.features`: `Feature`, `Option`, the list `FEATURES`)
and the app loops over them. It never imports the stand-in or the inspection tools (they depend on it).
"""

from ._filesystems import layout_caveat, mount_options
from ._logging import JsonFormatter, configure_logging, utc_timestamp
from ._serve import (
    CannotServe,
    RunningServer,
    SidecarServer,
    describe_startup,
    free_port,
    freeze_startup_objects,
    ready_line,
    ready_url,
    serve_forever,
    start_sidecar,
    stop_on_sigint_or_sigterm,
)
from ._settings import CAPTURE_UMASKS, OPTION_GROUPS, OPTIONS, ConfigError, Settings, load_settings
from .features import FEATURES, Feature, Option
from ._sidecar import Sidecar

__all__ = [
    "CAPTURE_UMASKS",
    "FEATURES",
    "OPTIONS",
    "OPTION_GROUPS",
    "CannotServe",
    "ConfigError",
    "Feature",
    "JsonFormatter",
    "Option",
    "RunningServer",
    "Settings",
    "Sidecar",
    "SidecarServer",
    "configure_logging",
    "describe_startup",
    "free_port",
    "freeze_startup_objects",
    "layout_caveat",
    "load_settings",
    "mount_options",
    "ready_line",
    "ready_url",
    "serve_forever",
    "start_sidecar",
    "stop_on_sigint_or_sigterm",
    "supervise_workers",
    "utc_timestamp",
]


def supervise_workers(settings: Settings, arguments: list[str]) -> int:
    """`--workers N`: start and watch the worker processes (`proxy.app._workers`, loaded only here:
    a worker never needs it)."""
    from ._workers import supervise_workers as supervise

    return supervise(settings, arguments)
