"""Prefix routing (docs/wire.md): which rollout a request belongs to and what goes upstream."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import unquote

from records.contract import is_valid_rollout_id

ROLLOUT_PREFIX = "/ng-rollout/"
#: Gym 0.7.0's URL contract for calls whose token ids are captured for training (config_types.py).
TRAINING_SEGMENT = "training-token-capture/"

#: Observed paths (captured when prefixed and capture is on) and their dialect names.
OBSERVED_PATHS = {
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
    "/v1/completions": "completions",
    # vLLM's token-in/token-out path (--enable-scale-out): its abort and render paths are not calls.
    "/inference/v1/generate": "generate",
}


@dataclass(frozen=True)
class Route:
    """Where one request goes. ``upstream_target`` is the raw path and query, never re-encoded."""

    upstream_target: str
    rollout_id: str | None = None
    #: The dialect of an observed path (POST only), else None.
    dialect: str | None = None
    #: Set when the prefix is present but its rollout id is not valid.
    invalid_rollout_id: str | None = None
    #: Gym's training path (``/ng-rollout/<id>/training-token-capture/...``): the token capture
    #: mode is on for this call, whatever the setting (docs/tokens.md).
    training_tokens: bool = False

    @property
    def error_dialect(self) -> str:
        """The dialect whose error shape a local reply on this path uses."""
        return "messages" if self.dialect == "messages" or _path_of(self.upstream_target) == "/v1/messages" else "openai"


def route_request(method: str, raw_target: str) -> Route:
    """Split ``/ng-rollout/<id>/<rest>`` into rollout id and ``/<rest>``; others pass through.

    Cached for targets of ordinary length: a rollout's agent sends the same target call after
    call, and `Route` is frozen. (The bound keeps odd or hostile targets from filling memory.)
    """
    if len(raw_target) <= _CACHED_TARGET_LENGTH:
        return _cached_route(method, raw_target)
    return _route(method, raw_target)


_CACHED_TARGET_LENGTH = 512


def _route(method: str, raw_target: str) -> Route:
    """Split ``/ng-rollout/<id>/<rest>`` into rollout id and ``/<rest>``; others pass through.

    The id is percent-decoded before it is validated, so ``%2e%2e`` is refused as ``..``.
    """
    if not raw_target.startswith(ROLLOUT_PREFIX):
        return Route(upstream_target=raw_target)
    path, question, query = raw_target.partition("?")
    encoded_id, slash, rest = path[len(ROLLOUT_PREFIX):].partition("/")
    training = rest.startswith(TRAINING_SEGMENT)
    if training:
        rest = rest[len(TRAINING_SEGMENT):]
    upstream_target = "/" + rest + question + query
    rollout_id = unquote(encoded_id, errors="strict") if _decodes(encoded_id) else None
    if rollout_id is None or not is_valid_rollout_id(rollout_id):
        return Route(upstream_target=upstream_target, invalid_rollout_id=encoded_id)
    dialect = OBSERVED_PATHS.get(_path_of(upstream_target)) if method == "POST" else None
    return Route(upstream_target=upstream_target, rollout_id=rollout_id, dialect=dialect, training_tokens=training)


_cached_route = lru_cache(maxsize=16384)(_route)


def _path_of(target: str) -> str:
    return target.partition("?")[0]


def _decodes(encoded: str) -> bool:
    try:
        unquote(encoded, errors="strict")
    except UnicodeDecodeError:
        return False
    return True


#: Paths an SDK reaches without its ``/v1`` (a base_url of ``http://sidecar/ng-rollout/<id>``).
#: The session headers the coding harnesses send of their own, read (in this order) when the
#: configured `session_id_header` is absent: Claude Code's, then Codex CLI's (docs/wire.md).
HARNESS_SESSION_HEADERS = ("x-claude-code-session-id", "session-id")
#: The agent within a session, and the agent that started it (a subagent's parent): Claude Code's
#: own headers, and Dynamo's parent session (its agents' convention), first present wins.
HARNESS_AGENT_HEADERS = ("x-claude-code-agent-id",)
HARNESS_PARENT_AGENT_HEADERS = ("x-claude-code-parent-agent-id", "x-dynamo-parent-session-id")

#: vLLM's scale-out endpoints, served only with ``--enable-scale-out`` (vLLM #54579, #55176; 0.29 and
#: later): the token-in path, the renderers (#36166, #50195) and the derenderers (#43606).
SCALE_OUT_PATHS = frozenset({
    "/inference/v1/generate", "/v1/chat/completions/render", "/v1/completions/render", "/v1/responses/render",
    "/v1/chat/completions/derender", "/v1/completions/derender"})

_API_PATHS = ("/chat/completions", "/responses", "/messages", "/completions", "/embeddings", "/models")


def base_url_mistake(upstream_target: str) -> str | None:
    """What a client's base_url probably got wrong, for a path the upstream answered 404, or None.

    Heuristic and only ever logged: the reply itself is forwarded unchanged (bytes are sacred).
    """
    path = _path_of(upstream_target)
    if path in SCALE_OUT_PATHS:
        # vLLM serves its token-in, token-out endpoint, /render and /derender only when started with
        # --enable-scale-out (vLLM #54579, #55176): a 404 here is that flag missing, not a wrong URL.
        return (f"vLLM serves {path} only when started with --enable-scale-out (as /inference/v1/generate, /render "
                "and /derender): restart vLLM with that flag (the chat and completions APIs need none)")
    if path.startswith("//") and "/" + path.lstrip("/").removeprefix("v1/") in _API_PATHS:
        return ("the path begins with '//': the client's base_url ends in '/' before the SDK's own /v1 "
                "(http://sidecar/ng-rollout/<id>/ + /v1/...): drop the trailing '/' from the base_url")
    if path.startswith("/v1/v1/"):
        return ("the path has /v1 twice: the client's base_url already ends in /v1 and the SDK adds another "
                "(the Anthropic SDK adds /v1 itself: give it http://sidecar/ng-rollout/<id> without /v1)")
    if path in _API_PATHS:
        return (f"the path {path} has no /v1: OpenAI SDKs need base_url http://sidecar/ng-rollout/<id>/v1 "
                "(the Anthropic SDK: http://sidecar/ng-rollout/<id>)")
    extra, separator, rest = path.partition("/v1/")
    if separator and extra and "/" + rest in _API_PATHS:
        # Said once whatever the segments (a rollout id with a '/' differs per sample).
        return ("the path has a segment before /v1: a rollout id cannot hold a '/' (the part after it became "
                "the path; use '-' or '.' instead, as in http://sidecar/ng-rollout/gsm8k-17/v1), or the "
                "base_url has a segment too many")
    return None
