"""Prefix supply on the proxy's side (docs/tokens.md, issue 32): the renderer round trips, and what the
sidecar learns of an upstream that cannot render.

`capture.render_requests` says what to render; this sends the three ``/tokenize`` requests at once
on the upstream pool (one round trip of added latency) and splices the prompt. Whatever fails --
an upstream without ``/tokenize``, a render refused, a template that is not prefix-stable -- the
call goes as the token capture mode would send it without supply, and the reason is counted; an
upstream that has no ``/tokenize`` at all is learnt once (never asked again until a restart).
"""

from __future__ import annotations

import asyncio
import logging
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
    """Per upstream: whether it renders (``/tokenize``)."""

    def __init__(self) -> None:
        self.renders = True

    async def prepare(self, call: "CallView", request: dict[str, Any], parent_call_id: str,
                      parent_sequence: list[int]) -> tuple[Optional[SuppliedPrefix], str]:
        """(the prefix to send, "") or (None, why not)."""
        renders = render_requests(request)
        if renders is None:
            return None, "no_assistant_turn"
        if renders.resumes_in_place:
            prompt, why = renders.prompt(parent_sequence, [], [], [])
            return (SuppliedPrefix(prompt, parent_call_id), "") if prompt else (None, why)
        if not self.renders:
            return None, "no_renderer"
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
                self.renders = False
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
