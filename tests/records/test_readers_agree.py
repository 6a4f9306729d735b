"""Every reader gives the trajectory builder's verdict (issue 61), over 500 generated rollouts made
through two real sidecars in the token capture mode on one capture directory (the stand-in
upstream): chat and Responses, the model's reasoning sent back or dropped (the stand-in's
``drop-reasoning`` template, a Responses reasoning item left out), tool calls and their results,
``previous_response_id`` with ``store``, retries (the same request again, on either sidecar),
streams the agent cut (its call recorded cancelled), and sessions re-pinned between the two
sidecars call by call.

For every call of every rollout, what `records.read_token_records` says (``link``,
``link_reason``, the call it ``extends``, ``drift_at``) equals the builder's `records.CallLink`;
`mcc stats --json` counts the builder's verdicts; `mcc show --json` gives each call's; the report
says why of every call the builder leaves unlinked."""

from __future__ import annotations

import pytest

import asyncio
import random
import subprocess
import sys
from collections import Counter
from typing import Any

import aiohttp
import orjson

from records import CaptureStore, read_token_records, trajectories

from tests.records.test_one_verdict_per_call import response_of, verdicts_of_builder, verdicts_of_records
from tests.wire import rollout_url

ROLLOUTS = 500
#: Rollouts under way at once (each is a sequence of calls).
AT_ONCE = 24
_TOOLS_CHAT = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
_TOOLS_RESPONSES = [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}]


class Agent:
    """One generated rollout: its shape drawn from ``rng``, its calls made through ``sidecars``."""

    def __init__(self, rng: random.Random, rollout_id: str, sidecars: list[str], http: aiohttp.ClientSession,
                 directory: str) -> None:
        self.rng, self.rollout_id, self.sidecars, self.http, self.directory = rng, rollout_id, sidecars, http, directory
        self.dialect = rng.choice(["chat", "responses"])
        self.turns = rng.randint(1, 4)
        self.tools = rng.random() < 0.3
        self.template = rng.choice(["chain", "chain", "drop-reasoning"])
        self.by_previous_id = self.dialect == "responses" and rng.random() < 0.2
        self.shape: Counter[str] = Counter()

    async def run(self) -> Counter[str]:
        history: list[dict[str, Any]] = [{"role": "user", "content": f"What is the weather? ({self.rollout_id})"}]
        previous_id = None
        for turn in range(self.turns):
            body = self._request(history, previous_id)
            if self.rng.random() < 0.05 and body.get("stream"):
                await self._cut(body)  # The agent gives up on this stream; it asks again.
                self.shape["cut"] += 1
            if self.dialect == "chat" and self.rng.random() < 0.1:
                reply = await self._abort_and_resume(body)
            else:
                reply = await self._call(body)
            if self.rng.random() < 0.15:
                await self._call(body)  # A retry: the same request again, maybe on the other sidecar.
                self.shape["retry"] += 1
            history, previous_id = self._next(history, body, reply, turn)
        self.shape[self.dialect] += 1
        return self.shape

    def _request(self, history: list[dict[str, Any]], previous_id: Any) -> dict[str, Any]:
        stream = self.rng.random() < 0.5
        if self.dialect == "chat":
            body: dict[str, Any] = {"model": "m", "messages": history, "stream": stream}
            if self.tools:
                body["tools"] = _TOOLS_CHAT
            return body
        body = {"model": "m", "stream": stream}
        if self.tools:
            body["tools"] = _TOOLS_RESPONSES
        if previous_id is not None:
            body.update(previous_response_id=previous_id, input=history[-1:])
        else:
            body["input"] = history
        return body

    def _url(self, body: dict[str, Any]) -> str:
        path = "/v1/chat/completions" if self.dialect == "chat" else "/v1/responses"
        return rollout_url(self.rng.choice(self.sidecars), self.rollout_id, path)

    async def _call(self, body: dict[str, Any], abort: bool = False) -> bytes:
        headers = {"Content-Type": "application/json", "X-Stand-In-Template": self.template}
        if abort:
            headers["X-Stand-In-Abort"] = "after-reasoning"
        async with self.http.post(self._url(body), data=orjson.dumps(body), headers=headers) as reply:
            data = await reply.read()
            assert reply.status == 200, data
            return data

    async def _abort_and_resume(self, body: dict[str, Any]) -> bytes:
        """The engine aborts the reply after its reasoning (a weight update); the agent resumes it
        (its partial reply sent back, ``continue_final_message``); the resumed reply, as if whole."""
        aborted = await self._call({**body, "stream": False}, abort=True)
        message = orjson.loads(aborted)["choices"][0]
        if message["finish_reason"] != "abort":
            return aborted  # A tool call: nothing to abort.
        self.shape["abort"] += 1
        partial = {"role": "assistant", "content": message["message"]["content"] or ""}
        resumed = await self._call({**body, "stream": False, "messages": [*body["messages"], partial],
                                    "continue_final_message": True, "add_generation_prompt": False})
        return resumed

    async def _cut(self, body: dict[str, Any]) -> None:
        async with self.http.post(self._url(body), data=orjson.dumps(body), headers={
                "Content-Type": "application/json", "X-Stand-In-Template": self.template}) as reply:
            await reply.content.readany()
            reply.close()

    def _next(self, history: list[dict[str, Any]], body: dict[str, Any], reply: bytes,
              turn: int) -> tuple[list[dict[str, Any]], Any]:
        """The conversation after this turn: the reply sent back as the agent sends it, then the
        tool's result or the user's next words."""
        follow = {"role": "user", "content": f"go on ({turn})"}
        if self.dialect == "chat":
            message = (orjson.loads(reply)["choices"][0]["message"] if not body.get("stream") or reply.startswith(b"{")
                       else CaptureStore(self.directory).read(self.rollout_id)[-1]["response"]["choices"][0]["message"])
            sent = {key: message[key] for key in ("role", "content", "tool_calls") if message.get(key) is not None}
            history = [*history, sent]
            calls = message.get("tool_calls") or []
            history += [{"role": "tool", "tool_call_id": calls[0]["id"], "content": "sunny"} if calls else follow]
            return history, None
        response = response_of(reply, bool(body.get("stream")))
        output = response["output"]
        keep_reasoning = self.rng.random() < 0.6
        sent_back = [item for item in output if keep_reasoning or item["type"] != "reasoning"]
        self.shape["reasoning kept" if keep_reasoning else "reasoning dropped"] += 1
        calls = [item for item in output if item["type"] == "function_call"]
        after = {"type": "function_call_output", "call_id": calls[0]["call_id"], "output": "sunny"} if calls else follow
        if self.by_previous_id:
            return [after], response["id"]
        return [*history, *sent_back, after], None


@pytest.mark.slow
async def test_every_reader_gives_the_builders_verdict_over_500_generated_rollouts(http, stand_in, start, capture_dir,
                                                                                  tmp_path):
    sidecars = [(await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)).url for _ in range(2)]
    rng = random.Random(61)
    agents = [Agent(random.Random(rng.random()), f"agree-{n:03d}", sidecars, http, capture_dir) for n in range(ROLLOUTS)]
    gate = asyncio.Semaphore(AT_ONCE)

    async def run(agent: Agent) -> Counter[str]:
        async with gate:
            return await agent.run()

    shapes = sum(await asyncio.gather(*(run(agent) for agent in agents)), Counter())
    # The generator drew every shape the property is about.
    for shape in ("chat", "responses", "retry", "cut", "abort", "reasoning kept", "reasoning dropped"):
        assert shapes[shape] > 0, shapes

    links: Counter[str] = Counter()
    drifting = extending = 0
    for agent in agents:
        builder = verdicts_of_builder(capture_dir, agent.rollout_id)
        readers = verdicts_of_records(capture_dir, agent.rollout_id)
        # A call without an entry (a stream cut before its reply ended) is in no build: no verdict.
        assert {call: said for call, said in readers.items() if said[0] is not None} == builder, agent.rollout_id
        assert set(builder) <= set(readers), agent.rollout_id
        links.update(status for status, _, _, _ in builder.values())
        drifting += sum(drift is not None for _, _, _, drift in builder.values())
        extending += sum(status == "extends" for status, _, _, _ in builder.values())
    # Every verdict is drawn: clean extensions, drift (drop-reasoning, dropped reasoning items),
    # roots (previous_response_id), retries left out.
    assert {"root", "extends", "unlinked", "left_out"} <= set(links), links
    print(f"\nshapes {dict(shapes)}; verdicts {dict(links)}; drifting {drifting}")

    stats = orjson.loads(subprocess.run([sys.executable, "-m", "proxy", "stats", capture_dir, "--json"],
                                        capture_output=True, check=True).stdout)
    assert stats["calls_by_link"] == dict(links)
    assert (stats["prompts_drifting"], stats["prompts_extending_an_earlier_call"]) == (drifting, extending)

    masked = next(agent.rollout_id for agent in agents if trajectories(capture_dir, agent.rollout_id).masked
                  and any(status == "unlinked" for status, *_ in verdicts_of_builder(capture_dir, agent.rollout_id).values()))
    shown = [orjson.loads(line) for line in subprocess.run(
        [sys.executable, "-m", "proxy", "show", capture_dir, masked, "--json"], capture_output=True, check=True).stdout.splitlines()]
    by_call = {record.call_index: record for record in read_token_records(capture_dir, masked)}
    for row in shown:
        record = by_call.get(row["call_index"])
        if record is not None:
            assert (row["link"], row["link_reason"], row["extends"], row["drift_at"]) == (
                record.link, record.link_reason, record.extends, record.drift_at)
    report = tmp_path / "report.html"
    subprocess.run([sys.executable, "-m", "proxy", "report", capture_dir, "--rollout", masked, "-o", str(report)],
                   capture_output=True, check=True)
    assert "records.trajectories masks this rollout" in report.read_text()
