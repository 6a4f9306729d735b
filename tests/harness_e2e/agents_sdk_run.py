"""One OpenAI Agents SDK run through the sidecar (run in the harness tier's cached venv, where the
SDK is installed): an agent with one function tool, asked a question the stand-in answers with a
tool call and then a final text. Usage: agents_sdk_run.py BASE_URL MODE, where MODE is one of
responses, responses-stream, responses-websocket, chat. Prints the final output."""

from __future__ import annotations

import asyncio
import sys

from agents import Agent, OpenAIChatCompletionsModel, OpenAIProvider, RunConfig, Runner, function_tool
from agents import set_tracing_disabled
from openai import AsyncOpenAI


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


async def main(base_url: str, mode: str) -> None:
    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key="sk-harness")
    if mode == "chat":
        agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather],
                      model=OpenAIChatCompletionsModel(model="stand-in", openai_client=client))
        config = RunConfig()
    else:
        agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model="stand-in")
        config = RunConfig(model_provider=OpenAIProvider(openai_client=client, use_responses=True,
                                                         use_responses_websocket=mode == "responses-websocket"))
    if mode in ("responses-stream", "responses-websocket"):
        result = Runner.run_streamed(agent, "What is the weather in Paris?", run_config=config)
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, "What is the weather in Paris?", run_config=config)
    print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
