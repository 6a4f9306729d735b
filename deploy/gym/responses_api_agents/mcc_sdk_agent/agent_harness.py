"""An SDK-based agent harness whose model calls are captured by the sidecar.

It takes Gym's run request as Gym sends it -- ``responses_create_params`` (the Responses API
parameters of the task) and the ``_ng_task_index`` / ``_ng_rollout_index`` / ``_ng_attempt_index``
indices -- and calls the model with the official openai SDK. `base_url_for_run` puts
``/ng-rollout/<rollout_id>`` into the SDK's base URL when observability is on (and leaves it
unchanged when it is off), so every call of the run lands in ``<rollout_id>.capture.jsonl``, the
file Gym's rollout collection reads for that row.

Only what the task set is sent: a Gym agent server hands over ``body.model_dump()``, where every
parameter the task left out is an explicit None (``"model": null`` and some 30 more), and a
None is not a choice of the agent's, so it is dropped rather than sent (issue 23).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Mapping

from openai import AsyncOpenAI

from records import base_url_for_run

#: The header the sidecar records as each call's ``client_session_id`` (its ``session_id_header``):
#: Gym's collection joins the captured calls to the agent invocation whose id it carries.
SESSION_HEADER = "x-session-id"


def request_params(run_request: Mapping[str, Any], global_config: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses API parameters to send: those the task set, and the policy model when it set none."""
    params = {key: value for key, value in dict(run_request["responses_create_params"]).items() if value is not None}
    params.setdefault("model", global_config.get("policy_model_name") or "policy")
    return params


async def run_agent(run_request: Mapping[str, Any], global_config: Mapping[str, Any]) -> dict[str, Any]:
    """One rollout: send the task's Responses request through the sidecar; return the row with its
    response and ``ng_agent_observations`` (`observations`), which Gym turns into the row's
    ``ng_trajectory``: without them its rollout-health checks of turns and conversations have
    nothing to read and report the rollout as unobserved."""
    params = request_params(run_request, global_config)
    base_url = base_url_for_run(global_config["mcc_base_url"], run_request,
                                observability_enabled=bool(global_config.get("observability_enabled")))
    invocation_id = f"mcc-sdk-agent-{uuid.uuid4().hex}"
    started = time.monotonic()
    async with AsyncOpenAI(base_url=base_url, api_key=str(global_config.get("policy_api_key") or "EMPTY"),
                           max_retries=0, default_headers={SESSION_HEADER: invocation_id}) as client:
        response = await client.responses.create(**params)
    reply = response.model_dump(mode="json", exclude_none=True)
    return {**run_request, "response": reply,
            "ng_agent_observations": observations(invocation_id, params, reply, (time.monotonic() - started) * 1000)}


def observations(invocation_id: str, params: Mapping[str, Any], reply: Mapping[str, Any],
                 duration_ms: float) -> dict[str, Any]:
    """Gym's ``AgentObservationBundle`` of one rollout: one agent invocation, its conversation (the
    request's input, then the reply's output items) and its outcome. Its calls are the captured
    calls that carry its id in `SESSION_HEADER` (Gym's join_model_call_observations)."""
    given = params.get("input")
    conversation = ([{"type": "message", "role": "user", "content": given}] if isinstance(given, str)
                    else [dict(item) for item in given or ()])
    conversation += [dict(item) for item in reply.get("output") or ()]
    status = reply.get("status")
    return {"source": "mcc_sdk_agent", "records": [{
        "kind": "agent_invocation", "invocation_id": invocation_id,
        "status": status if status in ("completed", "failed", "incomplete") else "unknown",
        "duration_ms": duration_ms, "conversation": conversation}], "gaps": []}
