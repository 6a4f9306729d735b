"""Prefix supply on the proxy's side (docs/tokens.md, issue 32): the renderer round trips, and what the
sidecar learns of an upstream that cannot render.

`capture.render_requests` says what to render; this sends the three ``/tokenize`` requests at once
on the upstream pool (one round trip of added latency) and splices the prompt. Whatever fails --
an upstream without ``/tokenize``, a render refused, a template that is not prefix-stable -- the
call goes as the token capture mode would send it without supply, and the reason is counted; an
upstream that has no ``/tokenize`` at all is learnt once (never asked again until a restart):
at start (`probe_renderer`, one ``POST /tokenize`` beside the engine probe) or at the first turn
whose render it refuses. SGLang takes no prompt ids for a chat call: supply is off there, said
at start and on each line that could have had it (``engine_sglang``).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import orjson

from capture import render_requests, tokenized_ids

from ..http import Headers, UpstreamBroke, WholeBody

if TYPE_CHECKING:
    from ..call import CallView

log = logging.getLogger("mcc.proxy")

#: Statuses that mean the upstream has no renderer at that path: learnt, never asked again.
_NO_RENDERER = (404, 405, 501)
#: The request headers a render takes from the agent's call (its credentials).
_RENDER_HEADERS = frozenset({b"authorization", b"x-api-key"})


@dataclass(frozen=True)
class SuppliedPrefix:
    """What one call was sent with: the whole prompt (its proof is the upstream's report that the
    prompt began with it) and the parent it extends."""

    prompt_token_ids: list[int]
    parent_call_id: str


class PrefixSupply:
    """Per upstream: whether supply is possible there (it renders with ``/tokenize`` and takes
    prompt ids), and if not, why (the reason each line that could have had a prefix carries)."""

    def __init__(self) -> None:
        #: None: supplied where a turn allows it; else why never (``no_renderer``, ``engine_sglang``).
        self.unavailable: Optional[str] = None

    @property
    def renders(self) -> bool:
        return self.unavailable is None

    async def prepare(self, call: "CallView", request: dict[str, Any], parent_call_id: str,
                      parent_sequence: list[int]) -> tuple[Optional[SuppliedPrefix], str]:
        """(the prefix to send, "") or (None, why not)."""
        renders = render_requests(request)
        if renders is None:
            return None, "no_assistant_turn"
        if renders.resumes_in_place:
            prompt, why = renders.prompt(parent_sequence, [], [], [])
            return (SuppliedPrefix(prompt, parent_call_id), "") if prompt else (None, why)
        if self.unavailable is not None:
            return None, self.unavailable
        target = _tokenize_target(call.route.upstream_target)
        headers: Headers = [(b"Content-Type", b"application/json"),
                            *((name, value) for name, value in call.request.headers if name.lower() in _RENDER_HEADERS)]
        replies = await asyncio.gather(*(self._render(call, target, headers, body) for body in renders.bodies()),
                                       return_exceptions=True)
        ids = []
        for reply in replies:
            if isinstance(reply, BaseException):
                return None, "render_failed"
            status, body = reply
            if status in _NO_RENDERER:
                self.unavailable = "no_renderer"
                log.warning("the upstream %s has no %s (%d): prefix supply is off for it; turns are sent as the agent "
                            "wrote them and their drift is recorded", call.ctx.upstream_url, target.decode(), status,
                            extra={"upstream": call.ctx.upstream_url, "status": status})
                return None, "no_renderer"
            found = tokenized_ids(_loads(body)) if status == 200 else None
            if found is None:
                return None, "render_refused"
            ids.append(found)
        prompt, why = renders.prompt(parent_sequence, *ids)
        return (SuppliedPrefix(prompt, parent_call_id), "") if prompt else (None, why)

    @staticmethod
    async def _render(call: "CallView", target: bytes, headers: Headers, body: dict[str, Any]) -> tuple[int, bytes]:
        reply = await call.ctx.upstream.request("POST", target, headers, orjson.dumps(body), True)
        sink = WholeBody()
        reply.attach(sink)
        try:
            return reply.status, await sink.done
        except UpstreamBroke as broke:
            return 0, broke.partial
        finally:
            reply.close()


#: How long the start's ``/tokenize`` probe may take (beside the engine probe, on a thread).
RENDER_PROBE_SECONDS = 2.0


def probe_renderer(upstream_url: str, ca_file: Optional[str] = None,
                   timeout: float = RENDER_PROBE_SECONDS) -> tuple[Optional[bool], str]:
    """Whether the upstream renders a chat (``POST /tokenize`` of a one-message conversation):
    True, False (404, 405 or 501: it has no renderer, learnt), or None (no answer yet -- a model
    server still starting -- learnt at the first turn instead); and what it answered. Blocking:
    run it on a thread."""
    url = upstream_url.rstrip("/") + "/tokenize"
    body = json.dumps({"messages": [{"role": "user", "content": "ping"}], "add_generation_prompt": True}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as reply:  # noqa: S310 (the operator's upstream)
            found = tokenized_ids(_loads(reply.read(1 << 20)))
    except urllib.error.HTTPError as exc:
        if exc.code in _NO_RENDERER:
            return False, f"POST /tokenize answered {exc.code}"
        return None, f"POST /tokenize answered {exc.code}"
    except (OSError, ValueError, http.client.HTTPException) as exc:  # Not up yet, or not speaking HTTP.
        return None, f"the upstream did not answer POST /tokenize ({type(exc).__name__}: {exc})"
    if found is None:
        return None, "POST /tokenize answered 200 without token ids"
    return True, "POST /tokenize renders the chat template"


def _tokenize_target(upstream_target: str) -> bytes:
    """vLLM's ``/tokenize`` beside the chat path (a gateway's prefix before ``/v1`` kept)."""
    path = upstream_target.partition("?")[0]
    prefix = path[:path.rfind("/v1/")] if "/v1/" in path else ""
    return f"{prefix}/tokenize".encode("latin-1")


def _loads(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
