"""One frozen settings object, built once at start-up (docs/configuration.md).

Sources, lowest to highest: defaults, a YAML file, ``MCC_*`` environment variables, CLI flags.
The YAML file may be a NeMo Gym global config: its top-level ``observability_enabled`` and
``model_call_capture_dir`` are honoured, the sidecar's own keys live under ``mcc:``, everything
else is ignored. The environment is read here and nowhere else.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

ENV_PREFIX = "MCC_"
#: The key of the sidecar's own section in a (NeMo Gym) YAML config.
CONFIG_SECTION = "mcc"
#: vLLM and SGLang bodies are JSON; 256 MiB leaves room for long multimodal prompts (issue 2).
DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
#: Long enough for a TCP connect across a cluster network, short enough to fail fast.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: Time allowed between two reads from the upstream: a non-streaming reasoning reply may take minutes.
DEFAULT_READ_TIMEOUT_S = 600.0
#: Kubernetes' default terminationGracePeriodSeconds is 30; the drain must end before it.
DEFAULT_DRAIN_TIMEOUT_S = 25.0
#: The longest --read-timeout: the silence allowed between two reads of a reply; a day is a typo.
MAX_READ_TIMEOUT_S = 3600.0
#: The longest --shutdown-delay: endpoints stop routing within seconds; an hour is a typo (1e9).
MAX_SHUTDOWN_DELAY_S = 3600.0
#: uvicorn (vLLM's server) closes idle keep-alive connections after 5 s: reuse them for less.
DEFAULT_UPSTREAM_IDLE_S = 4.0
#: A request head must arrive within this (nginx's client_header_timeout is 60 s).
DEFAULT_HEAD_TIMEOUT_S = 20.0
#: RL collectors keep thousands of streams open per sidecar; beyond this a flood is refused.
DEFAULT_MAX_CONNECTIONS = 16384
#: The schemes of ``capture_store`` (`records.STORE_SCHEMES`).
STORE_SCHEMES = ("segments", "s3", "gs", "az")
#: Values of ``capture_raw_stream``.
RAW_STREAM_MODES = ("always", "on-failure")


class ConfigError(Exception):
    """Bad configuration, described in one sentence; raised before serving."""


#: The settings that take one of a few words: the words, and how an error says them.
_CHOICES: dict[str, tuple[tuple[str, ...], str]] = {
    "log_level": (("debug", "info", "warning", "error"), "one of debug, info, warning, error"),
    "log_format": (("text", "json"), "text or json"),
    "capture_sync": (("auto", "fsync"), "auto or fsync"),
    "capture_raw_stream": (RAW_STREAM_MODES, "always or on-failure"),
    "capture_permissions": (("private", "group"), "private or group"),
    "forward": (("all", "model-api"), "all or model-api"),
    "engine": (("auto", "vllm", "sglang"), "auto, vllm or sglang"),
    "privacy": (("full", "metrics-only"), "full or metrics-only"),
}
#: The process umask of each ``capture_permissions``: files at most 0600 / 0640, directories 0700 / 0750.
CAPTURE_UMASKS = {"private": 0o077, "group": 0o027}


class Settings(BaseModel):
    """Everything the sidecar needs to know, validated before the first request."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    upstream: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    capture_dir: str | None = None
    #: NeMo Gym's ``observability_enabled``: capture is on only when this and a directory are set.
    capture_enabled: bool = True
    model_name: str | None = None
    #: The rollouts' policy model (the model trained): a captured call for another model is a side
    #: call, marked and never trained on; unset: the model of each rollout's first call.
    policy_model: str | None = None
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, gt=0)
    connect_timeout: float = Field(DEFAULT_CONNECT_TIMEOUT_S, gt=0)
    read_timeout: float = Field(DEFAULT_READ_TIMEOUT_S, gt=0, le=MAX_READ_TIMEOUT_S)
    session_id_header: str = "x-session-id"
    assistant_message_id_header: str = "x-assistant-message-id"
    log_level: str = "info"
    log_format: str = "text"
    #: Seconds in-flight calls get to finish after SIGTERM before the sidecar exits.
    drain_timeout: float = Field(DEFAULT_DRAIN_TIMEOUT_S, ge=0)
    #: Seconds the sidecar keeps accepting after SIGTERM, with /-/ready saying 503, before it
    #: drains: the time a rolling update takes to stop routing to it (endpoints propagate).
    shutdown_delay: float = Field(0.0, ge=0, le=MAX_SHUTDOWN_DELAY_S)
    stand_in: bool = False
    #: Seconds a pooled upstream connection may sit idle and still be reused: below the upstream's
    #: own keep-alive (uvicorn, which vLLM runs on, closes idle connections after 5 s).
    upstream_idle_timeout: float = Field(DEFAULT_UPSTREAM_IDLE_S, ge=0)
    #: A CA bundle (PEM) that signs an HTTPS upstream's certificate, beside the system's CAs.
    upstream_ca: str | None = None
    #: Seconds a client may take to send a whole request head (slowloris); nginx: 60.
    head_timeout: float = Field(DEFAULT_HEAD_TIMEOUT_S, gt=0)
    #: Client connections open at once; more are closed on arrival (a bound for floods).
    max_connections: int = Field(DEFAULT_MAX_CONNECTIONS, ge=1)
    #: Processes serving the port (``SO_REUSEPORT``); each has its own event loop.
    workers: int = Field(1, ge=1, le=256)
    #: Bind with ``SO_REUSEPORT`` (set for the processes of ``--workers``).
    reuse_port: bool = False
    #: Where the processes of ``--workers`` share their metrics (set by the supervisor).
    metrics_dir: str | None = None
    #: This worker's slot and the number of workers (set by the supervisor, for the logs).
    worker_index: int | None = None
    worker_count: int | None = None
    #: Durability barrier of a batch of lines: ``auto`` (one fsync, or one syncfs of the capture
    #: filesystem when the batch spans several files) or ``fsync`` (file by file; for a capture
    #: dir on a filesystem shared with heavy writers, whose flushes syncfs would wait for).
    capture_sync: str = "auto"
    #: ``response_raw`` (the stream's SSE text) on every streamed line (``always``, as NeMo Gym
    #: writes), or only when reassembly failed or the stream was cut (``on-failure``): a 32k-token
    #: stream with logprobs is several MB, and ``response`` already holds all of it.
    capture_raw_stream: str = "always"
    #: The token capture mode (docs/tokens.md): add to each captured request what vLLM needs to
    #: return the sampled token ids and their logprobs, and cut it from the agent's reply.
    capture_tokens: bool = False
    #: Where the training-token files go (docs/tokens.md); the capture dir when unset.
    token_dir: str | None = None
    #: Send a W3C ``traceparent`` upstream with each captured call the agent sent none with (its
    #: rollout's trace, its own span: `records.contract.traceparent`), so the upstream's spans (vLLM's
    #: ``--otlp-traces-endpoint``) join the trace `mcc export --format otel-json` writes. A header
    #: only: the body is forwarded byte-exact, and an agent's own ``traceparent`` is kept.
    trace_context: bool = True
    #: Prefix supply (docs/tokens.md, issue 32): a chat call whose lineage resolved a parent is sent
    #: with ``kv_transfer_params.prompt_token_ids`` = the parent's prompt + generation ids + the new
    #: turn's ids (the upstream's own renderer), so its prompt extends the parent exactly. Applies
    #: to the calls the token capture mode covers. Unset: on with ``--capture-tokens`` (issue 72:
    #: without it a multi-turn rollout on a real vLLM drifts and is masked); ``False`` turns it off.
    supply_prefix: bool | None = None
    #: MoE routed experts (docs/tokens.md): each call's ``routed_experts`` (vLLM with
    #: ``--enable-return-routed-experts``) stored apart, beside the token files, as an object named
    #: by its sha256 (its parent's rows not again); the token entry and the line name it. Applies
    #: to the calls the token capture mode covers.
    capture_routed_experts: bool = False
    #: The model server behind the token capture mode (docs/tokens.md): ``vllm``, ``sglang`` (its
    #: ``sglext`` token ids), or ``auto``: with ``--capture-tokens``, asked of the upstream at start
    #: (SGLang answers ``GET /server_info``), vLLM otherwise; said in the log either way.
    engine: str = "auto"
    #: Redaction (docs/privacy.md): a YAML file of rules (``rules: [{name, pattern}]``), each match
    #: replaced by ``[REDACTED:<name>:<tag>]`` in every line before it is written.
    redact: str | None = None
    #: ``module:function``: a callable given every text value (after the rules), returning its
    #: redacted text; one that raises or runs past ``redact_hook_budget`` seconds leaves the line in
    #: metrics-only form, marked ``redaction_failed``.
    redact_hook: str | None = None
    redact_hook_budget: float = Field(1.0, gt=0, le=60)
    #: Lines redacted by the hook at once, each on its own thread from the moment it is ready
    #: (docs/privacy.md): a hook past its budget keeps a thread until it returns, so size this to
    #: the calls in flight; with every thread so taken a new line is written metrics-only.
    redact_hook_workers: int = Field(16, ge=1, le=1024)
    #: The placeholders' key (hex, 32 bytes or more): sidecars given the same key name a rollout's
    #: values alike. Without it each sidecar draws its own, shared with its ``--workers``.
    redact_key: str | None = Field(None, repr=False)
    #: ``full`` (the default), or ``metrics-only``: ids, timing, status, usage, finish reasons and
    #: tool names kept, every content value replaced, no raw text, no token files.
    privacy: str = "full"
    #: With ``--privacy metrics-only``: keep the token ids and logprob numbers (the token capture
    #: mode's files, and the lines' arrays). Token ids decode to the text.
    privacy_keep_token_ids: bool = False
    #: A header sent upstream with each captured call, set to its rollout id (unless the agent sent
    #: it): a router places a session's calls on one replica by it (docs/wire.md): ``x-session-id``
    #: (vllm-router), ``x-smg-routing-key`` (SGLang's gateway), ``X-Dynamo-Session-ID`` (Dynamo).
    affinity_header: str | None = None
    #: Where the lines go past one node (docs/files.md): ``segments:///path`` (writer segments on a
    #: shared or local path), ``s3://bucket/prefix``, ``gs://...``, ``az://...`` (object storage).
    #: The capture dir is then this sidecar's spool: its open and unsent segments.
    capture_store: str | None = None
    #: A segment is sealed (and uploaded) at this size, or this many seconds after its first line.
    segment_max_bytes: int = Field(64 * 1024 * 1024, ge=4096)
    segment_max_age: float = Field(60.0, gt=0)
    #: The runner's and the trainer's token: every admin request that changes state (``POST
    #: /-/rollouts/<id>/end``, ``POST /-/run/end``, ``POST /-/weight-version``) needs
    #: ``Authorization: Bearer <token>``; model calls never do. Without one (and without
    #: ``open_admin``) such requests are refused: an agent, which holds only the model port and
    #: its API key, never changes what the trainer is told (docs/operations.md, "Who may change
    #: state"). From ``MCC_ADMIN_TOKEN``, the YAML file or ``--admin-token-file``; never a flag
    #: (a flag shows in ``ps``).
    admin_token: str | None = Field(None, repr=False)
    #: A file holding the admin token (a Kubernetes Secret mounted as a file), read at start.
    admin_token_file: str | None = None
    #: Let whatever reaches the port change state with no token (a trusted single-user setup only).
    open_admin: bool = False
    #: Who may read what the sidecar writes (capture files, spools, token files, directories):
    #: ``private`` (files 0600, directories 0700: the sidecar's user only; lines hold whole prompts
    #: and replies) or ``group`` (0640 / 0750: also the directories' group, e.g. a collector that
    #: runs with the pod's fsGroup under another user).
    capture_permissions: str = "private"
    #: What the port forwards: ``all`` (every path, as a reverse proxy) or ``model-api`` (the
    #: model API paths, vLLM's token endpoints and health; anything else 404 with a log line).
    forward: str = "all"

    @field_validator("capture_store")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        if value is None:
            return value
        scheme, separator, rest = value.partition("://")
        if not separator or scheme not in STORE_SCHEMES or not rest.strip("/"):
            raise ValueError("must be a store URL: segments:///path, s3://bucket/prefix, gs://bucket/prefix or "
                             "az://container/prefix")
        if scheme == "segments" and not rest.startswith("/"):
            raise ValueError("a segments:// store takes an absolute path: segments:///data/store")
        return value.rstrip("/")

    @field_validator("affinity_header")
    @classmethod
    def _header_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", value):
            raise ValueError("must be a header name (letters, digits and -, as x-session-id)")
        return value

    @field_validator("upstream_ca")
    @classmethod
    def _readable_ca(cls, value: str | None) -> str | None:
        if value is not None:
            import ssl
            try:
                ssl.create_default_context(cafile=value)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"cannot load a CA bundle from it: {getattr(exc, 'strerror', None) or exc}") from None
        return value

    @field_validator("capture_dir", "token_dir")
    @classmethod
    def _absolute_capture_dir(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isabs(value):
            raise ValueError("must be an absolute path")
        if value is not None and os.path.exists(value) and not os.path.isdir(value):
            raise ValueError("is a file, not a directory")
        return value

    @field_validator("upstream")
    @classmethod
    def _http_upstream(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.query or parts.fragment:
            raise ValueError("must not have a query or fragment")
        if parts.path.strip("/"):
            root = f"{parts.scheme}://{parts.netloc}"
            raise ValueError(f"must be the model server's root URL: drop {parts.path.rstrip('/')!r} "
                             f"and pass {root} (clients' /v1/... paths are forwarded as they are, so a /v1 here "
                             "would send every call to /v1/v1/...)")
        return value.rstrip("/")

    @field_validator("log_level", "log_format", "capture_sync", "capture_raw_stream", "capture_permissions",
                     "forward", "engine", "privacy")
    @classmethod
    def _one_of_its_choices(cls, value: str, info: ValidationInfo) -> str:
        choices, said = _CHOICES[info.field_name]  # type: ignore[index]  # validated fields are named
        if value.lower() not in choices:
            raise ValueError(f"must be {said}")
        return value.lower()

    @field_validator("redact_key")
    @classmethod
    def _a_key(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"(?:[0-9a-fA-F]{2}){32,}", value.strip()):
            raise ValueError("must be hex of 32 bytes or more (`openssl rand -hex 32` makes one)")
        return None if value is None else value.strip()

    @model_validator(mode="before")
    @classmethod
    def _admin_token_from_its_file(cls, data: Any) -> Any:
        """``--admin-token-file``: the token read at start (a Secret mounted as a file)."""
        path = data.get("admin_token_file") if isinstance(data, dict) else None
        if path is None:
            return data
        if data.get("admin_token") is not None:
            raise ValueError("the admin token is given twice (MCC_ADMIN_TOKEN and --admin-token-file): give one")
        try:
            with open(str(path), encoding="utf-8") as handle:
                token = handle.read().strip()
        except OSError as exc:
            raise ValueError(f"--admin-token-file {path}: {exc.strerror or exc}") from None
        if not token:
            raise ValueError(f"--admin-token-file {path} is empty")
        return {**data, "admin_token": token}

    @model_validator(mode="after")
    def _one_admin_token(self) -> "Settings":
        if self.admin_token is not None and not self.admin_token.strip():
            raise ValueError("the admin token (MCC_ADMIN_TOKEN) is empty")
        if self.admin_token is not None and self.open_admin:
            raise ValueError("--open-admin (MCC_OPEN_ADMIN) lets anyone change state, and an admin token is set: "
                             "give one or the other")
        return self

    @model_validator(mode="after")
    def _has_upstream(self) -> "Settings":
        if self.upstream is None and not self.stand_in:
            raise ValueError("an upstream is required: pass --upstream URL or set MCC_UPSTREAM")
        if self.upstream is not None and self.stand_in:
            # The records would name a server that was never used.
            raise ValueError("--stand-in serves its own model, so --upstream (MCC_UPSTREAM) would be ignored: "
                             "give one or the other")
        if self.capture_tokens and not self.capture_on:
            raise ValueError("--capture-tokens (MCC_CAPTURE_TOKENS) needs capture on, or it does nothing: "
                             "pass --capture-dir DIR (MCC_CAPTURE_DIR), with capture enabled")
        if self.capture_store is not None and not self.capture_on:
            raise ValueError("--capture-store (MCC_CAPTURE_STORE) needs a local spool: pass --capture-dir DIR "
                             "(MCC_CAPTURE_DIR) on this node's own disk, with capture enabled")
        if self.capture_store is not None and self.token_dir is not None and self.token_dir != self.capture_dir:
            raise ValueError("--capture-store (MCC_CAPTURE_STORE) ships the training-token files from the spool: "
                             "leave --token-dir (MCC_TOKEN_DIR) unset, or set it to the capture dir")
        if self.supply_prefix is True and not self.capture_on:
            raise ValueError("--supply-prefix (MCC_SUPPLY_PREFIX) needs the token capture mode, which needs capture on: "
                             "pass --capture-dir DIR (MCC_CAPTURE_DIR) and --capture-tokens")
        if self.privacy_keep_token_ids and self.privacy != "metrics-only":
            raise ValueError("--privacy-keep-token-ids (MCC_PRIVACY_KEEP_TOKEN_IDS) keeps token ids in a metrics-only "
                             "line; a full capture keeps them anyway: add --privacy metrics-only, or drop it")
        if (self.redact or self.redact_hook or self.privacy != "full") and not self.capture_on:
            raise ValueError("--redact, --redact-hook and --privacy apply to what is captured, and capture is off: "
                             "pass --capture-dir DIR (MCC_CAPTURE_DIR), with capture enabled")
        if self.redact or self.redact_hook:
            from ..privacy import load_redaction  # Fails closed: a rule or hook that cannot be used stops the start.
            from capture import RedactionConfigError
            try:
                load_redaction(self.redact, self.redact_hook)
            except RedactionConfigError as exc:
                raise ValueError(str(exc)) from None
        if self.capture_routed_experts and not self.capture_on:
            raise ValueError("--capture-routed-experts (MCC_CAPTURE_ROUTED_EXPERTS) needs the token capture mode, which "
                             "needs capture on: pass --capture-dir DIR (MCC_CAPTURE_DIR) and --capture-tokens")
        return self

    @property
    def capture_on(self) -> bool:
        return self.capture_enabled and self.capture_dir is not None

    @property
    def supplies_prefix(self) -> bool:
        """Whether prefix supply is on: as set, else with the token capture mode (``--capture-tokens``)."""
        return self.capture_on and (self.supply_prefix if self.supply_prefix is not None else self.capture_tokens)

    @property
    def model_ref_name(self) -> str:
        """``model_ref.name`` of every line: the configured name, else the upstream's host:port."""
        if self.model_name:
            return self.model_name
        parts = urlsplit(self.upstream or "")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{parts.hostname}:{port}" if parts.hostname else "stand-in"


def load_settings(
    cli: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    warn: Callable[[str], None] | None = None,
) -> Settings:
    """Merge the sources and validate; raise `ConfigError` with one sentence on any problem.

    The sentence names where the bad value came from -- the flag, the ``MCC_*`` variable or the
    YAML key -- and the value. ``warn`` hears what is suspicious but not fatal (an unknown
    ``MCC_*`` variable, a sidecar setting at the top level of a YAML file).
    """
    warn = warn or (lambda message: None)
    cli = {key: value for key, value in (cli or {}).items() if value is not None}
    environ = os.environ if environ is None else environ
    from_env = _from_environment(environ, warn)
    config_file = cli.pop("config", None) or from_env.pop("config", None)
    merged: dict[str, Any] = {}
    origins: dict[str, str] = {}
    hints: list[str] = []
    if config_file:
        values, yaml_origins, hints = _from_yaml(config_file)
        merged.update(values)
        origins.update(yaml_origins)
        for hint in hints:
            warn(hint)
    merged.update(from_env)
    origins.update({name: ENV_PREFIX + name.upper() for name in from_env})
    merged.update(cli)
    origins.update({name: _FLAG_NAMES.get(name, "--" + name.replace("_", "-")) for name in cli})
    if merged.get("capture_enabled") in (True, "true", "True", "1", "yes") and not merged.get("capture_dir"):
        raise ConfigError(f"{origins.get('capture_enabled', 'capture_enabled')} turns capture on but no capture "
                          "directory is set: pass --capture-dir DIR or set MCC_CAPTURE_DIR.")
    try:
        return Settings(**merged)
    except ValidationError as exc:
        raise ConfigError(_one_sentence(exc, origins, merged, hints)) from None


#: Settings whose values are secrets: an error names them, never quotes them.
_SECRET_SETTINGS = frozenset({"redact_key", "admin_token"})
#: Settings the supervisor of ``--workers`` sets for its workers: never suggested to users.
_INTERNAL_SETTINGS = frozenset({"reuse_port", "metrics_dir", "worker_index", "worker_count"})
#: Flags whose names are not ``--`` + the setting's name.
_FLAG_NAMES = {"capture_enabled": "--capture/--no-capture"}
#: ``MCC_*`` variables that are not settings but are read by the sidecar, its tests or its benchmarks.
#: The project's other variables: not settings, never warned about (``MCC_STORE_CACHE``: where the
#: readers of a capture store keep its view, records.store).
_OTHER_VARIABLES = {"MCC_CONFIG", "MCC_SOAK_SECONDS", "MCC_GYM_VENV", "MCC_REPORT_SCREENSHOTS", "MCC_STORE_CACHE"}


def _from_environment(environ: Mapping[str, str], warn: Callable[[str], None]) -> dict[str, Any]:
    names = set(Settings.model_fields) | {"config"}
    found = {}
    for name in names:
        value = environ.get(ENV_PREFIX + name.upper())
        if value is not None and value != "":
            found[name] = value
    known = {ENV_PREFIX + name.upper() for name in names} | _OTHER_VARIABLES
    for variable in sorted(environ):
        if variable.startswith(ENV_PREFIX) and variable not in known:
            listed = sorted(ENV_PREFIX + n.upper() for n in Settings.model_fields if n not in _INTERNAL_SETTINGS)
            close = difflib.get_close_matches(variable, listed, n=1, cutoff=0.8)
            warn(f"ignoring unknown environment variable {variable}: "
                 + (f"did you mean {close[0]}?" if close else f"the settings are {', '.join(listed)}"))
    return found


def _from_yaml(path: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    try:
        with open(path, encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path!r}: {exc.strerror or exc}.") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path!r} is not valid YAML: {_yaml_problem(exc)}.") from None
    if document is None:
        return {}, {}, []
    if not isinstance(document, dict):
        raise ConfigError(f"config file {path!r} must be a YAML mapping at the top level.")
    return _from_config_document(document, path)


def _from_config_document(document: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    settings: dict[str, Any] = {}
    origins: dict[str, str] = {}
    where = os.path.basename(path)
    if "observability_enabled" in document:
        settings["capture_enabled"] = document["observability_enabled"]
        origins["capture_enabled"] = f"observability_enabled in {where}"
    if document.get("model_call_capture_dir") is not None:
        settings["capture_dir"] = document["model_call_capture_dir"]
        origins["capture_dir"] = f"model_call_capture_dir in {where}"
    if document.get("observability_enabled") is True and "capture_dir" not in settings:
        raise ConfigError(f"config file {path!r} sets observability_enabled but no model_call_capture_dir.")
    own = document.get(CONFIG_SECTION) or {}
    if not isinstance(own, dict):
        raise ConfigError(f"config file {path!r}: the {CONFIG_SECTION!r} section must be a mapping.")
    for key, value in own.items():
        name = str(key).replace("-", "_")
        if name not in Settings.model_fields:
            raise ConfigError(f"config file {path!r}: unknown key {CONFIG_SECTION}.{key}.")
        settings[name] = value
        origins[name] = f"{CONFIG_SECTION}.{key} in {where}"
    hints = [f"config file {path!r}: top-level {key!r} is not read by the sidecar; its settings go under "
             f"'{CONFIG_SECTION}:' ({CONFIG_SECTION}.{key})"
             for key in document if str(key).replace("-", "_") in _SIDECAR_ONLY and str(key).replace("-", "_") not in own]
    return settings, origins, hints


#: Settings a top-level YAML key is likely meant as (not NeMo Gym's own top-level keys).
_SIDECAR_ONLY = {"upstream", "capture_dir", "capture_store", "capture_sync", "capture_permissions", "forward", "capture_raw_stream", "capture_tokens", "supply_prefix", "capture_routed_experts", "engine", "redact", "redact_hook", "privacy", "token_dir", "model_name", "max_body_bytes",
                 "drain_timeout", "stand_in", "workers", "read_timeout", "connect_timeout"}


def _one_sentence(exc: ValidationError, origins: Mapping[str, str], values: Mapping[str, Any], hints: list[str]) -> str:
    error = exc.errors()[0]
    field = ".".join(str(part) for part in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    if not field:
        sentence = message[:1].upper() + message[1:]
        if error["msg"].find("upstream is required") >= 0 and hints:
            sentence += f" ({'; '.join(hints)})"
        return sentence + "."
    if error["type"] == "extra_forbidden":
        return f"unknown setting {field!r}."
    origin = origins.get(field) or f"setting {field!r}"
    if field in _SECRET_SETTINGS:  # A key is never echoed, even a malformed one.
        return f"invalid {origin}: {message}."
    return f"invalid {origin} {values.get(field)!r}: {message}."


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The YAML error's problem and where it is (line and column, 1-based)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or _first_line(exc)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
