"""Which paths the sidecar forwards (``--forward``; docs/operations.md, "What the port forwards").

``all`` forwards every path, as a reverse proxy does. ``model-api`` forwards the model API only --
the paths the SDKs and agent harnesses call, the token endpoints, health -- so the sidecar's port
is no wider than the model API: a vLLM server's admin and development routes (``/reset_prefix_cache``,
``/collective_rpc``, ``/sleep``, LoRA loading, ...) are answered 404 here, never reach it.
"""

from __future__ import annotations

import re

from ._routing import Route

FORWARD_MODES = ("all", "model-api")

#: The model API, by upstream path (the rollout prefix already taken off; no query).
_MODEL_API = re.compile(
    r"^/v1/(?:"
    r"chat/completions|completions|embeddings|"
    r"responses(?:/[^/]+(?:/(?:cancel|input_items))?)?|"  # Responses, and one response (retrieve, cancel, items)
    r"messages(?:/count_tokens)?|"  # Anthropic Messages
    r"models(?:/[^/]+)?"  # the models list, one model
    r")$"
    r"|^/(?:tokenize|detokenize|inference/v1/generate|inference/v1/abort_requests)$"  # vLLM's token endpoints, token in / token out
    r"|^/(?:health|ping|version|v1/health)$"
)


def forwards(mode: str, route: Route) -> bool:
    """Whether ``route`` goes upstream under ``--forward mode``."""
    if mode == "all":
        return True
    return _MODEL_API.match(route.upstream_target.partition("?")[0]) is not None


__all__ = ["FORWARD_MODES", "forwards"]
