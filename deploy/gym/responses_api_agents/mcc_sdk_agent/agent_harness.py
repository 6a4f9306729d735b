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

from typing import Any, Mapping

from openai import AsyncOpenAI

from records import base_url_for_run


def request_params(run_request: Mapping[str, Any], global_config: Mapping[str, Any]) -> dict[str, Any]:
    """The Responses API parameters to send: those the task set, and the policy model when it set none."""
    params = {key: value for key, value in dict(run_request["responses_create_params"]).items() if value is not None}
    params.setdefault("model", global_config.get("policy_model_name") or "policy")
    return params


async def run_agent(run_request: Mapping[str, Any], global_config: Mapping[str, Any]) -> dict[str, Any]:
    """One rollout: send the task's Responses request through the sidecar; return the row with its response."""
    params = request_params(run_request, global_config)
    base_url = base_url_for_run(global_config["mcc_base_url"], run_request,
                                observability_enabled=bool(global_config.get("observability_enabled")))
    async with AsyncOpenAI(base_url=base_url, api_key=str(global_config.get("policy_api_key") or "EMPTY"),
                           max_retries=0) as client:
        response = await client.responses.create(**params)
    return {**run_request, "response": response.model_dump(mode="json", exclude_none=True)}
