"""An agent harness that sends every model call of a run through the capture sidecar.

`base_url_for_run` puts `/ng-rollout/<rollout_id>` into the SDK's base URL when observability is
on, and leaves it unchanged when it is off, so the same harness works either way.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from records import base_url_for_run


async def run_agent(run_request: dict[str, Any], base_url: str, *, observability_enabled: bool) -> str:
    """One rollout: ask the policy model once and return its answer."""
    client = AsyncOpenAI(base_url=base_url_for_run(base_url, run_request, observability_enabled=observability_enabled),
                         api_key="unused")
    async with client:
        reply = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": run_request["prompt"]}])
    return reply.choices[0].message.content or ""
