"""One frozen settings object, built once at start-up (docs/configuration.md).

Its fields are the declared options: the proxy's own (`PROXY_OPTIONS`) and each feature's
(`proxy.app.features`), in the feature list's order; so are its checks. Sources, lowest to
highest: defaults, a YAML file, ``MCC_*`` environment variables, CLI flags. The YAML file may be a
NeMo Gym global config: its top-level ``observability_enabled`` and ``model_call_capture_dir`` are
honoured, the sidecar's own keys live under ``mcc:``, everything else is ignored. The environment
is read here and nowhere else.
"""

from __future__ import annotations

import difflib
import os
import re
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, Callable, Mapping
from urllib.parse import urlsplit

import yaml
from pydantic import AfterValidator, Field, ValidationError, create_model, model_validator

from .features import FEATURES, Option, SettingsBase, absolute_directory

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


class ConfigError(Exception):
    """Bad configuration, described in one sentence; raised before serving."""


#: The process umask of each ``capture_permissions``: files at most 0600 / 0640, directories 0700 / 0750.
CAPTURE_UMASKS = {"private": 0o077, "group": 0o027}


def _http_upstream(value: str | None) -> str | None:
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


def _readable_ca(value: str | None) -> str | None:
    if value is not None:
        import ssl
        try:
            ssl.create_default_context(cafile=value)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot load a CA bundle from it: {getattr(exc, 'strerror', None) or exc}") from None
    return value


def _header_name(value: str | None) -> str | None:
    if value is not None and not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", value):
        raise ValueError("must be a header name (letters, digits and -, as x-session-id)")
    return value


#: ``mcc serve --help`` and docs/configuration.md show the options in sections, in this order; within
#: one, the proxy's own options first, then each feature's in the feature list's order.
OPTION_GROUPS = ("Forward and listen", "Capture", "Storage past one node", "Training token ids", "Privacy",
                 "The upstream connection", "Client connections", "Shutdown", "Logs")
_LISTEN, _CAPTURE, _UPSTREAM, _CLIENTS, _SHUTDOWN, _LOGS = (OPTION_GROUPS[0], OPTION_GROUPS[1], OPTION_GROUPS[5],
                                                            OPTION_GROUPS[6], OPTION_GROUPS[7], OPTION_GROUPS[8])

#: The proxy's own options (every feature's are its own: `proxy.app.features`).
PROXY_OPTIONS: tuple[Option, ...] = (
    Option("upstream", str | None, None, "Model server to forward to, e.g. http://127.0.0.1:8000.", _LISTEN,
           metavar="URL", validate=_http_upstream, default_said="required, unless `--stand-in`", yaml_hint=True),
    Option("stand_in", bool, False, "Serve the built-in stand-in model server as the upstream.", _LISTEN,
           switch=True, yaml_hint=True),
    Option("host", str, "127.0.0.1", "Address to bind (default 127.0.0.1; 0.0.0.0 in a container).", _LISTEN),
    Option("port", int, 8080, "Port to bind (default 8080; 0 picks a free port).", _LISTEN,
           bounds={"ge": 0, "le": 65535}),
    #: Processes serving the port (``SO_REUSEPORT``); each has its own event loop.
    Option("workers", int, 1, "Processes serving the port with SO_REUSEPORT (default 1).", _LISTEN,
           bounds={"ge": 1, "le": 256}, yaml_hint=True),
    #: What the port forwards: ``all`` (every path, as a reverse proxy) or ``model-api`` (the
    #: model API paths, vLLM's token endpoints and health; anything else 404 with a log line).
    Option("forward", str, "all", "What the port forwards: all (every path; default) or model-api (the model API, "
           "vLLM's token endpoints and health; anything else 404, said in the log).", _LISTEN,
           choices=("all", "model-api"), choices_said="all or model-api", yaml_hint=True),
    Option("capture_dir", str | None, None, "Absolute directory for <rollout_id>.capture.jsonl; capture is off "
           "without it.", _CAPTURE, metavar="DIR", validate=absolute_directory, default_said="none: capture off",
           yaml_hint=True),
    #: NeMo Gym's ``observability_enabled``: capture is on only when this and a directory are set.
    Option("capture_enabled", bool, True, "Turn capture on or off (NeMo Gym's observability_enabled).", _CAPTURE,
           flags=("--capture", "--no-capture"), default_said="on (when a capture dir is set)"),
    Option("model_name", str | None, None, "model_ref.name of every record (default: the upstream's host:port).",
           _CAPTURE, metavar="NAME", default_said="the upstream's `host:port`", yaml_hint=True),
    #: ``response_raw`` (the stream's SSE text) on every streamed line (``always``, as NeMo Gym
    #: writes), or only when reassembly failed or the stream was cut (``on-failure``): a 32k-token
    #: stream with logprobs is several MB, and ``response`` already holds all of it.
    Option("capture_raw_stream", str, "always", "Keep each stream's SSE text as response_raw always (default), or "
           "only when reassembly failed or the stream was cut.", _CAPTURE, choices=("always", "on-failure"),
           choices_said="always or on-failure", yaml_hint=True),
    #: Durability barrier of a batch of lines: ``auto`` (one fsync, or one syncfs of the capture
    #: filesystem when the batch spans several files) or ``fsync`` (file by file; for a capture
    #: dir on a filesystem shared with heavy writers, whose flushes syncfs would wait for).
    Option("capture_sync", str, "auto", "auto: fsync, or one syncfs per batch of several files; fsync: file by file "
           "(default auto).", _CAPTURE, choices=("auto", "fsync"), choices_said="auto or fsync", yaml_hint=True),
    #: Who may read what the sidecar writes (capture files, spools, token files, directories):
    #: ``private`` (files 0600, directories 0700: the sidecar's user only; lines hold whole prompts
    #: and replies) or ``group`` (0640 / 0750: also the directories' group, e.g. a collector that
    #: runs with the pod's fsGroup under another user).
    Option("capture_permissions", str, "private", "Who may read what the sidecar writes: private (files 0600, "
           "directories 0700; default: lines hold whole prompts and replies) or group (0640 / 0750, e.g. a "
           "collector in the pod's fsGroup).", _CAPTURE, choices=("private", "group"),
           choices_said="private or group", yaml_hint=True),
    #: A CA bundle (PEM) that signs an HTTPS upstream's certificate, beside the system's CAs.
    Option("upstream_ca", str | None, None, "CA bundle (PEM) for an HTTPS upstream with a private or self-signed "
           "certificate.", _UPSTREAM, metavar="FILE", validate=_readable_ca),
    #: Long enough for a TCP connect across a cluster network, short enough to fail fast.
    Option("connect_timeout", float, DEFAULT_CONNECT_TIMEOUT_S, "Seconds to connect to the upstream (default 10).",
           _UPSTREAM, bounds={"gt": 0}, yaml_hint=True),
    Option("read_timeout", float, DEFAULT_READ_TIMEOUT_S, "Seconds allowed between upstream reads (default 600).",
           _UPSTREAM, bounds={"gt": 0, "le": MAX_READ_TIMEOUT_S}, yaml_hint=True),
    #: Seconds a pooled upstream connection may sit idle and still be reused: below the upstream's
    #: own keep-alive (uvicorn, which vLLM runs on, closes idle connections after 5 s).
    Option("upstream_idle_timeout", float, DEFAULT_UPSTREAM_IDLE_S, "Seconds a pooled upstream connection may idle "
           "and be reused; keep it below the upstream's keep-alive (default 4; uvicorn: 5).", _UPSTREAM,
           bounds={"ge": 0}),
    #: Send a W3C ``traceparent`` upstream with each captured call the agent sent none with (its
    #: rollout's trace, its own span: `records.contract.traceparent`), so the upstream's spans (vLLM's
    #: ``--otlp-traces-endpoint``) join the trace `mcc export --format otel-json` writes. A header
    #: only: the body is forwarded byte-exact, and an agent's own ``traceparent`` is kept.
    Option("trace_context", bool, True, "Send a W3C traceparent upstream with each captured call that has none (the "
           "rollout's trace; the upstream's spans join it; default on).", _UPSTREAM),
    #: A header sent upstream with each captured call, set to its rollout id (unless the agent sent
    #: it): a router places a session's calls on one replica by it (docs/wire.md): ``x-session-id``
    #: (vllm-router), ``x-smg-routing-key`` (SGLang's gateway), ``X-Dynamo-Session-ID`` (Dynamo).
    Option("affinity_header", str | None, None, "Send each captured call upstream with this header set to its "
           "rollout id (unless the agent sent it), for a router that places sessions by a header: x-session-id "
           "(vllm-router), x-smg-routing-key (SGLang), X-Dynamo-Session-ID (Dynamo).", _UPSTREAM, metavar="NAME",
           validate=_header_name),
    Option("max_body_bytes", int, DEFAULT_MAX_BODY_BYTES, "Largest request body accepted (default 256 MiB).",
           _CLIENTS, bounds={"gt": 0}, default_said=f"{DEFAULT_MAX_BODY_BYTES} (256 MiB)", yaml_hint=True),
    #: Seconds a client may take to send a whole request head (slowloris); nginx: 60.
    Option("head_timeout", float, DEFAULT_HEAD_TIMEOUT_S, "Seconds a client may take to send a request head "
           "(default 20).", _CLIENTS, bounds={"gt": 0}),
    #: Client connections open at once; more are closed on arrival (a bound for floods).
    Option("max_connections", int, DEFAULT_MAX_CONNECTIONS, "Client connections open at once (default 16384).",
           _CLIENTS, bounds={"ge": 1}),
    #: Seconds in-flight calls get to finish after SIGTERM before the sidecar exits.
    Option("drain_timeout", float, DEFAULT_DRAIN_TIMEOUT_S, "Seconds in-flight calls may finish after SIGTERM "
           "(default 25).", _SHUTDOWN, bounds={"ge": 0}, yaml_hint=True),
    #: Seconds the sidecar keeps accepting after SIGTERM, with /-/ready saying 503, before it
    #: drains: the time a rolling update takes to stop routing to it (endpoints propagate).
    Option("shutdown_delay", float, 0.0, "Seconds to keep accepting after SIGTERM while /-/ready says 503, before "
           "draining (rolling updates; default 0).", _SHUTDOWN, bounds={"ge": 0, "le": MAX_SHUTDOWN_DELAY_S}),
    Option("log_level", str, "info", "Default info.", _LOGS, choices=("debug", "info", "warning", "error"),
           choices_said="one of debug, info, warning, error"),
    Option("log_format", str, "text", "Default text.", _LOGS, choices=("text", "json"), choices_said="text or json"),
    Option("session_id_header", str, "x-session-id",
           meaning="the request header copied to each line as `client_session_id`"),
    Option("assistant_message_id_header", str, "x-assistant-message-id",
           meaning="the request header copied to each line as `client_assistant_message_id`"),
    #: Bind with ``SO_REUSEPORT`` (set for the processes of ``--workers``).
    Option("reuse_port", bool, False, "Bind with SO_REUSEPORT (set for workers).", switch=True, internal=True),
    #: Where the processes of ``--workers`` share their metrics (set by the supervisor).
    Option("metrics_dir", str | None, None, "Where workers share their metrics (set for workers).", internal=True),
    #: This worker's slot and the number of workers (set by the supervisor, for the logs).
    Option("worker_index", int | None, None, "This worker's slot (set for workers).", internal=True),
    Option("worker_count", int | None, None, "How many workers (set for workers).", internal=True),
)


def _check_the_proxy(settings: SettingsBase) -> None:
    if settings.upstream is None and not settings.stand_in:
        raise ValueError("an upstream is required: pass --upstream URL or set MCC_UPSTREAM")
    if settings.upstream is not None and settings.stand_in:
        # The records would name a server that was never used.
        raise ValueError("--stand-in serves its own model, so --upstream (MCC_UPSTREAM) would be ignored: "
                         "give one or the other")


#: Every option, the proxy's first, then each feature's in the feature list's order.
OPTIONS: tuple[Option, ...] = PROXY_OPTIONS + tuple(option for feature in FEATURES for option in feature.options)
OPTIONS_BY_NAME = {option.name: option for option in OPTIONS}
if len(OPTIONS_BY_NAME) != len(OPTIONS):  # Two features declaring one name: a mistake, said at import.
    raise RuntimeError("an option is declared twice: " + ", ".join(
        sorted({o.name for o in OPTIONS if sum(p.name == o.name for p in OPTIONS) > 1})))


def _field(option: Option) -> tuple[Any, Any]:
    """The pydantic field of a declared option: its type (with its checks) and its default."""
    checks: list[Any] = []
    if option.choices:
        checks.append(AfterValidator(partial(_one_of, option.choices, option.choices_said)))
    if option.validate is not None:
        checks.append(AfterValidator(option.validate))
    # ``Annotated[type, check, ...]``, made at run time from the declaration.
    kind = Annotated[tuple([option.type, *checks])] if checks else option.type
    return kind, Field(option.default, repr=not option.secret, **option.bounds)


def _one_of(choices: tuple[str, ...], said: str, value: str) -> str:
    if value.lower() not in choices:
        raise ValueError(f"must be {said}")
    return value.lower()


def _given(cls: type, data: Any) -> Any:
    if isinstance(data, dict):
        for feature in FEATURES:
            data = feature.given(data)
    return data


def _checked(self: SettingsBase) -> SettingsBase:
    _check_the_proxy(self)
    for feature in FEATURES:
        feature.check(self)
    return self


if TYPE_CHECKING:  # To mypy, a `SettingsBase`: its fields are Any (they are made from the declarations).
    Settings = SettingsBase
else:
    Settings = create_model(
        "Settings", __base__=SettingsBase, __module__=__name__,
        __doc__="Everything the sidecar needs to know, validated before the first request: the proxy's options "
                "and each feature's (`proxy.app.features`).",
        __validators__={"_given": model_validator(mode="before")(classmethod(_given)),
                        "_checked": model_validator(mode="after")(_checked)},
        **{option.name: _field(option) for option in OPTIONS})


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
    origins.update({name: OPTIONS_BY_NAME[name].flag if name in OPTIONS_BY_NAME else "--" + name.replace("_", "-")
                    for name in cli})
    if merged.get("capture_enabled") in (True, "true", "True", "1", "yes") and not merged.get("capture_dir"):
        raise ConfigError(f"{origins.get('capture_enabled', 'capture_enabled')} turns capture on but no capture "
                          "directory is set: pass --capture-dir DIR or set MCC_CAPTURE_DIR.")
    try:
        return Settings(**merged)
    except ValidationError as exc:
        raise ConfigError(_one_sentence(exc, origins, merged, hints)) from None


#: Settings whose values are secrets: an error names them, never quotes them.
_SECRET_SETTINGS = frozenset(option.name for option in OPTIONS if option.secret)
#: Settings the supervisor of ``--workers`` sets for its workers: never suggested to users.
_INTERNAL_SETTINGS = frozenset(option.name for option in OPTIONS if option.internal)
#: ``MCC_*`` variables that are not settings but are read by the sidecar, its tests or its benchmarks.
#: The project's other variables: not settings, never warned about (``MCC_STORE_CACHE``: where the
#: readers of a capture store keep its view, records.store; ``MCC_NO_EXTENSIONS``: the pure-Python
#: per-event core, capture/_native.py).
_OTHER_VARIABLES = {"MCC_CONFIG", "MCC_SOAK_SECONDS", "MCC_GYM_VENV", "MCC_REPORT_SCREENSHOTS", "MCC_STORE_CACHE",
                    "MCC_NO_EXTENSIONS"}


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
_SIDECAR_ONLY = frozenset(option.name for option in OPTIONS if option.yaml_hint)


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
