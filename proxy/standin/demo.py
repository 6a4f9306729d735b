"""`mcc demo`: the stand-in model server, the sidecar in front of it, the official SDKs driving it.

Every dialect is called streaming and not, plus one tool-call round trip; then every captured
line is read back with `records` and printed, one line per call.
"""

from __future__ import annotations

import os
from typing import Any

from records import CaptureStore, ModelCallRecord, read_model_call_records, read_token_records, trajectories

from ..app import Settings, start_sidecar
from ._serving import start_stand_in

ROLLOUTS = ("demo-responses", "demo-chat", "demo-messages", "demo-tools", "demo-rl", "demo-rl-drift", "demo-completions")
MODEL = "stand-in-1"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


async def run_demo(capture_dir: str) -> int:
    try:
        import anthropic  # noqa: F401
        import openai  # noqa: F401
    except ImportError:
        print("mcc demo needs the official SDKs: pip install openai anthropic (or `make demo` from the checkout)")
        return 2
    capture_dir = os.path.abspath(capture_dir)
    store = CaptureStore(capture_dir)
    store.clear(ROLLOUTS)
    stand_in = await start_stand_in()
    # The token capture mode (--capture-tokens): token ids and logprobs of every call, though the
    # agents below never ask for them.
    settings = Settings(upstream=stand_in.url, port=0, capture_dir=capture_dir, model_name="stand-in", capture_tokens=True)
    sidecar = await start_sidecar(settings)
    print(f"stand-in model server: {stand_in.url}\nsidecar:               {sidecar.url}  (capture dir {capture_dir})\n")
    try:
        await _drive(sidecar.url)
    finally:
        await sidecar.close()
        await stand_in.close()
    return _print_captures(store)


async def _drive(sidecar_url: str) -> None:
    from anthropic import AsyncAnthropic
    from openai import AsyncOpenAI

    def openai_client(rollout: str) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"{sidecar_url}/ng-rollout/{rollout}/v1", api_key="demo-key", max_retries=0)

    responses = openai_client("demo-responses")
    reply = await responses.responses.create(model=MODEL, input="Say hello to the sidecar.")
    _said("responses", False, reply.output_text)
    text = ""
    async for event in await responses.responses.create(model=MODEL, input="Stream a hello.", stream=True):
        if event.type == "response.output_text.delta":
            text += event.delta
    _said("responses", True, text)

    chat = openai_client("demo-chat")
    completion = await chat.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi there!"}])
    _said("chat", False, completion.choices[0].message.content)
    text = ""
    stream = await chat.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Stream please."}],
                                                stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        text += "".join(choice.delta.content or "" for choice in chunk.choices)
    _said("chat", True, text)

    messages = AsyncAnthropic(base_url=f"{sidecar_url}/ng-rollout/demo-messages", api_key="demo-key", max_retries=0)
    message = await messages.messages.create(model=MODEL, max_tokens=256, messages=[{"role": "user", "content": "Hello, Claude-shaped stand-in."}])
    _said("messages", False, "".join(block.text for block in message.content if block.type == "text"))
    async with messages.messages.stream(model=MODEL, max_tokens=256, messages=[{"role": "user", "content": "Stream it."}]) as events:
        final = await events.get_final_message()
    _said("messages", True, "".join(block.text for block in final.content if block.type == "text"))

    await _tool_round_trip(openai_client("demo-tools"))
    await _rl_generation(openai_client("demo-rl"))
    legacy = await openai_client("demo-completions").completions.create(model=MODEL, prompt="def multiply(a, b):")
    _said("completions", False, legacy.choices[0].text)
    # The same two turns under the template that drops the model's reasoning (as Qwen3's does).
    drifting = AsyncOpenAI(base_url=f"{sidecar_url}/ng-rollout/demo-rl-drift/v1", api_key="demo-key", max_retries=0,
                           default_headers={"X-Stand-In-Template": "drop-reasoning"})
    await _rl_generation(drifting)


async def _rl_generation(client: Any) -> None:
    """An RL rollout whose agent asks for no token data: two turns of chat. The sidecar adds
    `logprobs` / `return_token_ids`, keeps the arrays and cuts them from the replies."""
    conversation: list[dict[str, Any]] = [{"role": "user", "content": "Solve 6 x 7."}]
    stream = await client.chat.completions.create(model=MODEL, messages=conversation, stream=True,
                                                  stream_options={"include_usage": True})
    text, leaked = "", 0
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            leaked += bool(choice.logprobs) or bool((choice.model_extra or {}).get("token_ids"))
    _said("chat", True, text + ("" if not leaked else f"  (!! {leaked} chunks with token data)"))
    conversation += [{"role": "assistant", "content": text}, {"role": "user", "content": "And 7 x 8?"}]
    second = await client.chat.completions.create(model=MODEL, messages=conversation)
    _said("chat", False, second.choices[0].message.content)


async def _tool_round_trip(client: Any) -> None:
    """The model asks for a tool, the agent runs it, the model answers with the result."""
    conversation: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = await client.chat.completions.create(model=MODEL, messages=conversation, tools=[WEATHER_TOOL])
    call = first.choices[0].message.tool_calls[0]
    _said("chat", False, f"tool call {call.function.name}({call.function.arguments})")
    conversation.append(first.choices[0].message.model_dump(exclude_none=True))
    conversation.append({"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny", "celsius": 22}'})
    second = await client.chat.completions.create(model=MODEL, messages=conversation, tools=[WEATHER_TOOL])
    _said("chat", False, second.choices[0].message.content)


def _said(dialect: str, streamed: bool, text: Any) -> None:
    print(f"  agent <- {dialect:11} {'stream' if streamed else 'json':6} {text!r}")


def _print_captures(store: CaptureStore) -> int:
    header = (f"{'rollout':16} {'#':>2} {'dialect':11} {'status':>6} {'in':>5} {'out':>5} {'cached':>6} "
              f"{'ttft_ms':>8} {'total_ms':>8}  {'finish':10} {'resp.status':11} {'tool calls':22} error")
    print("\ncaptured calls (read back with records.read_model_call_records):")
    print(header)
    print("-" * len(header))
    count = 0
    for rollout in ROLLOUTS:
        for record in read_model_call_records(store, rollout, strict=True):
            count += 1
            print(_format_record(rollout, record))
    print(f"\n{count} calls captured in {len(ROLLOUTS)} rollouts; files: {store.capture_dir}/<rollout_id>.capture.jsonl")
    print("\ntraining arrays, whose agents asked for none (--capture-tokens; records.read_token_records):")
    arrays = 0
    for rollout in ("demo-rl", "demo-rl-drift", "demo-completions"):
        for token_record in read_token_records(store, rollout):
            arrays += token_record.usable
            drift = (f"extends #{token_record.extends}" + (", sent on its exact ids: prefix supply"
                                                           if token_record.prefix_supplied else "")
                     if token_record.extends is not None else
                     f"prompt drifts at token {token_record.drift_at} from #{token_record.drift_from}"
                     if token_record.drift_at is not None else "first turn")
            print(f"  {rollout} #{token_record.call_index}: source={token_record.source} "
                  f"prompt_token_ids={_head(token_record.prompt_token_ids)} generation_token_ids={_head(token_record.generation_token_ids)} "
                  f"generation_log_probs={_head(token_record.generation_log_probs)} usable={token_record.usable} ({drift})")
    print("\ntrajectories (records.trajectories: the calls chained as a trainer takes them, Gym's files):")
    chains = {}
    for rollout in ("demo-rl", "demo-rl-drift"):
        build = chains[rollout] = trajectories(directory_of(store), rollout)
        main = build.main
        shape = (f"{len(main.calls)} call(s), {len(main.token_ids):,} ids, {sum(main.loss_mask):,} trained"
                 if main is not None else "no chain")
        print(f"  {rollout:14} {shape}; " + ("masked: " + (build.mask_reason or "") if build.masked else "trainable"))
    print("  (demo-rl-drift's template drops the first turn's reasoning, as Qwen3's does: rendered as the agent\n"
          "   sent it, its second prompt would not begin with the first call's ids and the rollout would be\n"
          "   masked; prefix supply, on by default in the token mode, sent it on those ids: trainable.\n"
          "   --no-supply-prefix shows the drift: docs/tokens.md, \"Prefix supply\")")
    directory = store.capture_dir
    print(f"""
next, on these captures:
  .venv/bin/mcc ls {directory}                      # one row per rollout
  .venv/bin/mcc show {directory} demo-tools         # the calls of one rollout, in order
  .venv/bin/mcc show {directory} demo-rl            # ... with their training arrays and drift
  .venv/bin/mcc stats {directory}                   # totals, latency and TTFT percentiles, errors
  .venv/bin/mcc report {directory} -o report.html   # one HTML page to open in a browser
  .venv/bin/python -m records {directory}           # one JSON summary line per rollout""")
    clean, drifted = chains["demo-rl"], chains["demo-rl-drift"]
    supplied = [record.prefix_supplied for record in read_token_records(store, "demo-rl-drift")]
    return 0 if count >= 13 and arrays == 5 and not clean.masked and not drifted.masked and supplied == [None, True] \
        else 1


def directory_of(store: CaptureStore) -> str:
    return store.capture_dir


def _head(values: Any) -> str:
    if values is None:
        return "-"
    return f"[{', '.join(str(v) for v in values[:3])}, ...] ({len(values)})"


def _format_record(rollout: str, record: ModelCallRecord) -> str:
    tools = ",".join(f"{call['name']}({','.join(call['arguments'])})" for call in record.tool_calls) or "-"
    return (f"{rollout:16} {record.call_index:>2} {record.dialect or '-':11} {record.status_code!s:>6} "
            f"{_n(record.tokens_in):>5} {_n(record.tokens_out):>5} {_n(record.cached_tokens):>6} "
            f"{_ms(record.latency_ttft_ms):>8} {_ms(record.latency_total_ms):>8}  {record.finish_reason or '-':10} "
            f"{record.response_status or '-':11} {tools:22} {record.error_category or '-'}")


def _n(value: Any) -> str:
    return "-" if value is None else str(value)


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}"
