"""How a feature declares itself (docs/layout.md, "Adding a feature"): `Option`, `Feature`, `FeatureHost`.

A feature of the sidecar (privacy, the store upload, the token mode...) is a `Feature` subclass in
a module of its own under ``proxy/app/features/``, named once in the feature list
(`proxy.app.features.FEATURES`). It declares, in one place:

- its **options** (`Option`): each setting with its flag, ``MCC_*`` variable and YAML key (all from
  its name), help, default and validation. `proxy.app.Settings`, ``mcc serve``'s flags and
  docs/configuration.md are made from the declared options, in the feature list's order;
- the **checks** of its settings against the others' (`Feature.check`);
- its **metrics** (metric groups, scraped from the start);
- what it **makes** once the port is bound (`prepare`), what it **starts** (`start`), the **call
  hooks** it gives a captured call (`call_hooks`), the **admin endpoints** it answers, what it
  says in ``/-/ready``, and how it **drains** (`drain_lines`, before the journal closes; `stop`,
  after).

mitmproxy's addons do the same (``load(loader)`` / ``loader.add_option``, their hooks and ``done``);
Envoy AI Gateway's filters are configured filter by filter. The call itself (`proxy.call`) names no
feature: it runs the hooks it is given (docs/layout.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, ClassVar, Optional, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from capture.journal import Journal, SegmentPolicy

    from ...call import CallContext, CallHooks, LocalReply, Route, SidecarMetrics
    from ...http import ReplyWriter, ServerRequest


class SettingsBase(BaseModel):
    """What every `proxy.app.Settings` is: frozen, unknown keys refused, and the properties the
    proxy's own options give. Its fields are the declared options (`proxy.app._settings`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    if TYPE_CHECKING:  # The fields are made from the declarations: to mypy, each is Any.
        def __init__(self, **values: Any) -> None: ...

        def __getattr__(self, name: str) -> Any: ...

    @property
    def capture_on(self) -> bool:
        """Capture is on: enabled (NeMo Gym's ``observability_enabled``) and a capture dir set."""
        return bool(self.capture_enabled) and self.capture_dir is not None

    @property
    def model_ref_name(self) -> str:
        """``model_ref.name`` of every line: the configured name, else the upstream's host:port."""
        if self.model_name:
            return str(self.model_name)
        parts = urlsplit(self.upstream or "")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.hostname}:{port}" if parts.hostname else "stand-in"


@dataclass(frozen=True)
class Option:
    """One setting: its flag is ``--`` + its name with ``-``, its variable ``MCC_`` + its name in
    capitals, its YAML key its name under ``mcc:`` (docs/configuration.md)."""

    name: str
    #: The value's type as pydantic reads it (``str | None``, ``int``, ``bool``...).
    type: Any
    default: Any = None
    #: The flag's help (``mcc serve --help`` and docs/configuration.md). None: no flag (a variable
    #: or a YAML key only); then `meaning` says what it is.
    help: Optional[str] = None
    #: The section of ``mcc serve --help`` and docs/configuration.md it is shown in.
    group: Optional[str] = None
    meaning: Optional[str] = None
    #: The flag's value name in the help (``URL``, ``DIR``).
    metavar: Optional[str] = None
    #: The words it takes (lowered), and how an error says them (``"text or json"``).
    choices: tuple[str, ...] = ()
    choices_said: str = ""
    #: pydantic's bounds: ``{"ge": 0}``, ``{"gt": 0, "le": 60}``.
    bounds: dict[str, Any] = field(default_factory=dict)
    #: Checks the value alone: returns it (cleaned) or raises ValueError with the reason.
    validate: Optional[Callable[[Any], Any]] = None
    #: A bool's flag: ``"pair"`` (``--x/--no-x``, the default) or ``"switch"`` (``--x`` only).
    switch: bool = False
    #: The flags, when not ``--`` + the name (``("--capture", "--no-capture")``).
    flags: tuple[str, ...] = ()
    #: A secret: never in a repr or an error.
    secret: bool = False
    #: Why ``--`` + its name is refused as a flag (a secret would show in ``ps``): the way to give it.
    refused_flag: Optional[str] = None
    #: Set by the supervisor of ``--workers`` for its workers: a hidden flag, never suggested.
    internal: bool = False
    #: What docs/configuration.md says its default is, when the value alone would not say it.
    default_said: Optional[str] = None
    #: A top-level key of this name in a (NeMo Gym) YAML file is warned about: it belongs under ``mcc:``.
    yaml_hint: bool = False

    @property
    def variable(self) -> str:
        return "MCC_" + self.name.upper()

    @property
    def flag(self) -> str:
        """The flag as an error names it (``--capture/--no-capture``)."""
        return "/".join(self.flags) if self.flags else "--" + self.name.replace("_", "-")


class FeatureHost(Protocol):
    """What a feature is given of the sidecar (`proxy.app.Sidecar`): read, and the few parts it may set."""

    settings: SettingsBase
    metrics: "SidecarMetrics"
    upstream_url: str
    #: Made before the features' `start`; None with capture off.
    journal: "Optional[Journal]"
    #: What every call shares; made before the features' `start`.
    calls: "CallContext"
    #: What a feature sets in `prepare` for the journal: writer segments (the store upload).
    journal_segments: "Optional[SegmentPolicy]"

    def feature(self, kind: "type[F]") -> "Optional[F]":
        """The running feature of that class, when it is on."""

    def spawn_background(self, coroutine: Any) -> None:
        """Run ``coroutine`` to completion even if the request that started it is cancelled."""


#: An admin endpoint's answer: status and JSON body.
AdminAnswer = tuple[int, bytes]


class Feature:
    """A feature of the sidecar. Subclass it in a module of its own under ``proxy/app/features/``,
    declare what it has, override the moments it takes part in (each is a no-op here), and add it
    to `proxy.app.features.FEATURES`."""

    #: What logs and docs call it.
    name: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()
    #: Metric groups (classes taking a registry), put on the sidecar's registry from the start.
    metrics: ClassVar[tuple[type, ...]] = ()
    #: Admin endpoints (docs/wire.md, "The sidecar's own endpoints"): a path's start under ``/-/``
    #: (``/-/run/end``; ending in ``/`` it takes every path below: ``/-/rollouts/``), with how the
    #: 404 of an unknown path names it.
    admin_paths: ClassVar[tuple[tuple[str, str], ...]] = ()

    @classmethod
    def given(cls, values: dict[str, Any]) -> dict[str, Any]:
        """The raw settings before validation, changed where a value comes from elsewhere (a file)."""
        return values

    @classmethod
    def check(cls, settings: SettingsBase) -> None:
        """Raise ValueError (one sentence naming the flags) when its settings do not fit the others'."""

    @classmethod
    def wanted(cls, settings: SettingsBase) -> bool:
        """Whether it runs with these settings (its objects are made, its hooks chosen)."""
        return False

    def __init__(self, host: FeatureHost) -> None:
        self.host = host
        self.settings = host.settings

    def prepare(self) -> None:
        """Once the port is bound, before the journal: make what it needs (files, processes)."""

    async def start(self) -> None:
        """Once the journal and the calls' context exist, before serving (every feature's at once)."""

    def call_hooks(self, route: "Route") -> "Optional[CallHooks]":
        """Its part in a captured call (`proxy.call.CallHooks`), chosen when the call starts; None: none."""
        return None

    def line_hooks(self) -> "tuple[CallHooks, ...]":
        """Hooks every captured line takes first, whatever made it (a bridged WebSocket turn too)."""
        return ()

    def refusal(self, route: "Route") -> "Optional[tuple[LocalReply, str]]":
        """A local reply when a captured call must not go upstream (its rollout ended), else None."""
        return None

    def serve_admin(self, path: bytes, request: "ServerRequest") -> "Awaitable[Optional[AdminAnswer]]":
        """Answer one of its `admin_paths` (``path``: the whole path, without its query); None: not
        one of its endpoints after all (the 404 that lists them answers)."""
        raise NotImplementedError

    def serve_upgrade(self, request: "ServerRequest", client: "ReplyWriter") -> "Optional[Awaitable[None]]":
        """Take an upgraded connection (a WebSocket), or None to leave it to the others."""
        return None

    def reread(self) -> None:
        """SIGUSR1 (from the supervisor of ``--workers``): read again what the workers share."""

    def ready(self) -> dict[str, object]:
        """What it adds to ``/-/ready``'s body (never its status: a capture fault never fails a call)."""
        return {}

    async def drain_lines(self) -> None:
        """On close, once every call is done, before the journal closes (lines it still holds)."""

    async def stop(self, timeout: float) -> None:
        """On close, after the journal closed (what it shipped or published)."""


if TYPE_CHECKING:
    from typing import TypeVar

    F = TypeVar("F", bound=Feature)


def absolute_directory(value: Optional[str]) -> Optional[str]:
    """A directory setting: absolute, and not a file."""
    if value is not None and not os.path.isabs(value):
        raise ValueError("must be an absolute path")
    if value is not None and os.path.exists(value) and not os.path.isdir(value):
        raise ValueError("is a file, not a directory")
    return value
