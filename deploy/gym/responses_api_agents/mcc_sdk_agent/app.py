"""A NeMo Gym agent server for SDK-based agents whose model calls the sidecar captures.

Gym's layout (``responses_api_agents/<name>/app.py`` with ``configs/`` and ``requirements.txt``),
so ``ng_run`` started in ``deploy/gym`` finds and starts it like one of its own. For each row of
a rollout collection (``/run``) it seeds a session on the resources server, runs the agent
(`agent_harness.run_agent`: the openai SDK, its base URL pointed at the sidecar under the row's
rollout id), and has the resources server verify the reply. The model calls never pass through
Gym's model server: the sidecar in front of the model records them, into the capture directory
Gym's collection reads (``model_call_capture_dir``), and Gym attaches them to the row.

Replace `agent_harness.run_agent` with your agent; keep its contract (the row in, the row with
its ``response`` out, model calls through ``base_url_for_run``).
"""

from __future__ import annotations

from fastapi import Request
from pydantic import ConfigDict

from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyResponse
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, Body, SimpleResponsesAPIAgent
from nemo_gym.config_types import ResourcesServerRef
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import get_response_json, raise_for_status

from agent_harness import run_agent


class MccSdkAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef


class MccSdkAgentRunRequest(BaseRunRequest):
    model_config = ConfigDict(extra="allow")


class MccSdkAgentVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow")


class MccSdkAgent(SimpleResponsesAPIAgent):
    config: MccSdkAgentConfig

    # FastAPI declares a body parameter by its default (Gym's agents do the same).
    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:  # noqa: B008
        raise NotImplementedError("mcc_sdk_agent's agent calls the model itself (through the sidecar): use /run")

    async def run(self, request: Request, body: MccSdkAgentRunRequest) -> MccSdkAgentVerifyResponse:
        resources = self.config.resources_server.name
        seeded = await self.server_client.post(server_name=resources, url_path="/seed_session",
                                               json=body.model_dump(), cookies=request.cookies)
        await raise_for_status(seeded)
        # The row as the collection sent it: a plain dump would add every parameter the task left
        # out, as null, and the agent would send them (issue 23).
        row = body.model_dump(exclude_unset=True)
        if body.capture_rollout_id:  # An explicit id is excluded from dumps; the harness needs it.
            row["_ng_rollout_id"] = body.capture_rollout_id
        result = await run_agent(row, self.server_client.global_config_dict)
        result.pop("_ng_rollout_id", None)
        # The agent's observations go to the collection (its ng_trajectory), not to the verifier.
        observed = result.pop("ng_agent_observations", None)
        verified = await self.server_client.post(server_name=resources, url_path="/verify", json=result,
                                                 cookies=seeded.cookies)
        await raise_for_status(verified)
        reply = MccSdkAgentVerifyResponse.model_validate(await get_response_json(verified))
        if observed is not None:
            # Not a declared field of the response model: set as an extra attribute.
            setattr(reply, "ng_agent_observations", observed)  # noqa: B010
        return reply


if __name__ == "__main__":
    MccSdkAgent.run_webserver()
