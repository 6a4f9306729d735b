"""Training-token files and trajectories against issue 31's targets.

    python benchmarks/bench_trajectories.py [--quick]

1. Bytes on disk per generated token, token capture mode on, ``--capture-raw-stream on-failure``:
   a 32,000-token vLLM-shaped stream (`fast_upstream`, logprob entries as vLLM writes them) through
   the sidecar; the capture line (what the agent saw) plus the training-token entry, per token.
2. A 50-turn session, 1,000 new tokens a turn, through the sidecar against a scripted chat model
   whose template keeps every sent-back turn: the token file's bytes against the bytes of each new
   token stored once (an id per prompt token, an id and a float per generated one), and what the
   file would hold if every prompt were stored whole.
3. `records.trajectories` against NeMo Gym 0.7.0's own ``trajectories_for_rollout`` (its
   ``prefix_merging``) on the same 1,000 rollouts (copies: Gym freezes what it reads), rollouts/s,
   Gym in its cached venv (skipped, saying so, without it).

Prints markdown tables and writes them to benchmarks/results/trajectories.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import orjson  # noqa: E402

from records.contract import TokenFiles  # noqa: E402
from records.contract.writing import token_entry  # noqa: E402
from records import read_token_entries, trajectories  # noqa: E402

GYM_BUILD = """
import sys, time
from pathlib import Path
from nemo_gym.token_id_capture.consumer import trajectories_for_rollout
directory, count = sys.argv[1], int(sys.argv[2])
started = time.perf_counter()
masked = sum(trajectories_for_rollout(f"r{i:05d}", [Path(directory)])["mask_sample"] for i in range(count))
print(time.perf_counter() - started, masked)
"""


async def bytes_per_token(workdir: str) -> dict[str, float]:
    """Section 1: one 32,000-token call in the mode, on-failure raw."""
    import bench_batch
    from fast_upstream import RL_TOKENS

    parts = await bench_batch.line_of_32k(workdir)
    line, entry = parts["the whole line"], parts["the training-token entry"]
    arrays = parts["its generation_token_ids"] + parts["its generation_log_probs"] + parts["its prompt_token_ids"]
    return {"tokens": RL_TOKENS, "line": line, "entry": entry, "per_token": (line + entry) / RL_TOKENS,
            "arrays_per_token": arrays / RL_TOKENS, "text_per_token": parts["message (the text)"] / RL_TOKENS}


async def fifty_turns(workdir: str, turns: int) -> dict[str, float]:
    """Section 2: a session of ``turns`` turns through an in-process sidecar."""
    import aiohttp

    from proxy import Settings, start_sidecar
    from tests.scripted_upstream import ScriptedUpstream, json_script
    from tests.vllm_chat_model import TinyChatModel

    model = TinyChatModel(replies={turn: ("w" * 999 + str(turn % 10)) for turn in range(1, turns + 1)})
    upstream = await ScriptedUpstream().start()
    upstream.responder = lambda received: json_script(model.body(orjson.loads(received.body)))
    capture_dir = os.path.join(workdir, "session")
    sidecar = await start_sidecar(Settings(upstream=upstream.url, port=0, capture_dir=capture_dir, capture_tokens=True,
                                           capture_raw_stream="on-failure", max_body_bytes=64 * 2**20))
    messages = [{"role": "user", "content": "start"}]
    try:
        async with aiohttp.ClientSession() as http:
            for turn in range(turns):
                async with http.post(f"{sidecar.url}/ng-rollout/session/v1/chat/completions",
                                     data=orjson.dumps({"model": "m", "messages": messages})) as reply:
                    said = orjson.loads(await reply.read())["choices"][0]["message"]["content"]
                messages += [{"role": "assistant", "content": said}, {"role": "user", "content": f"next {turn}"}]
    finally:
        await sidecar.close()
        await upstream.close()
    entries = read_token_entries(capture_dir, "session")
    once = sum(len(orjson.dumps(e["prompt_token_ids"])) + len(orjson.dumps(e["generation_token_ids"]))
               + len(orjson.dumps(e["generation_log_probs"])) for e in entries)
    whole_prompts = sum(e["cum_len"] - len(e["generation_token_ids"]) for e in entries)
    stored_prompts = sum(len(e["prompt_token_ids"]) for e in entries)
    file_bytes = os.path.getsize(os.path.join(capture_dir, "session.tokens.jsonl"))
    average_id = sum(len(orjson.dumps(e["prompt_token_ids"])) for e in entries) / max(stored_prompts, 1)
    return {"turns": turns, "file": file_bytes, "once": once, "ratio": file_bytes / once,
            "whole": file_bytes + (whole_prompts - stored_prompts) * average_id,
            "deltas": sum(e["prompt_is_delta"] for e in entries),
            "lines": os.path.getsize(os.path.join(capture_dir, "session.capture.jsonl"))}


def write_rollouts(directory: str, count: int, calls: int, tokens: int) -> None:
    """Section 3's input: ``count`` rollouts of ``calls`` chained calls, as the sidecar writes them."""
    files = TokenFiles(directory)
    for r in range(count):
        sequence, parent = list(range(1, 200)), None
        previous: list[int] = []
        items = [{"role": "user", "content": "q"}]
        for c in range(calls):
            generated = [1000 + (r * 7 + c * 13 + k) % 30000 for k in range(tokens)]
            entry = token_entry(rollout_id=f"r{r:05d}", model_call_id=f"r{r}c{c}", model="m", prompt_token_ids=sequence,
                                generation_token_ids=generated, generation_log_probs=[-0.5 - k / 997 for k in range(tokens)],
                                items=[{"type": "message", "role": "assistant", "content": f"a{c}"}],
                                response_id=f"resp{c}", created_at=1.0 + c, request=items, parent_call_id=parent,
                                parent_resolution="root" if parent is None else "resolved", reason="",
                                parent_sequence=sequence if parent is None else previous)
            files.append(entry)
            previous = [*sequence, *generated]
            parent, sequence = f"r{r}c{c}", [*previous, 7, 8, 9]
            items = [*items, {"role": "assistant", "content": f"a{c}"}, {"role": "user", "content": "t"}]


def builders(workdir: str, count: int) -> dict[str, float]:
    """Section 3: rollouts/s, ours and Gym's, on copies of the same files."""
    from tests.gym_conformance.gym_venv import GymUnavailable, gym_python

    source = os.path.join(workdir, "rollouts")
    os.makedirs(source)
    write_rollouts(source, count, calls=8, tokens=400)
    result: dict[str, float] = {"rollouts": count}
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        masked = sum(trajectories(source, f"r{i:05d}").masked for i in range(count))
        best = min(best, time.perf_counter() - started)
    result.update(ours=count / best, ours_masked=masked)
    try:
        gym = gym_python()
    except GymUnavailable as exc:
        result["gym_skipped"] = str(exc)  # type: ignore[assignment]
        return result
    gym_best = float("inf")
    for round_ in range(3):
        copy = os.path.join(workdir, f"gym-{round_}")
        shutil.copytree(source, copy)
        done = subprocess.run([gym, "-c", GYM_BUILD, copy, str(count)], capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            result["gym_skipped"] = done.stderr[-500:]  # type: ignore[assignment]
            return result
        seconds, gym_masked = done.stdout.split()
        gym_best = min(gym_best, float(seconds))
    result.update(gym=count / gym_best, gym_masked=int(gym_masked))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="20 turns and 200 rollouts")
    quick = parser.parse_args().quick
    out = [f"# Training-token files and trajectories (issue 31), Python {sys.version.split()[0]}", ""]
    with tempfile.TemporaryDirectory() as workdir:
        per_token = asyncio.run(bytes_per_token(workdir))
        session = asyncio.run(fifty_turns(workdir, 20 if quick else 50))
        built = builders(workdir, 200 if quick else 1000)
    out += ["| measure | value | target |", "|---|---:|---|",
            f"| bytes on disk per generated token, mode on, on-failure raw ({per_token['tokens']:,}-token call: line "
            f"{per_token['line']:,} + entry {per_token['entry']:,}) | {per_token['per_token']:.1f} | <= 24 |",
            f"| of which the arrays (ids and logprobs, once) | {per_token['arrays_per_token']:.1f} | |",
            f"| of which the reply's text, in the line and again in the entry's output_items (Gym's contract) | "
            f"2 x {per_token['text_per_token']:.1f} | |",
            f"| {session['turns']}-turn session, 1,000 new tokens a turn: token file / each new token stored once "
            f"({session['file']:,} / {session['once']:,} bytes; {session['deltas']} delta prompts) | "
            f"{session['ratio']:.2f} | <= 1.3 |",
            f"| the same file if every prompt were stored whole | {session['whole'] / session['once']:.1f}x | (quadratic) |",
            f"| the session's capture lines (what the agents saw, no arrays) | {session['lines']:,} bytes | |"]
    if "gym" in built:
        out.append(f"| records.trajectories vs Gym's trajectories_for_rollout, {built['rollouts']:,} rollouts of 8 calls "
                   f"({built['ours']:,.0f} vs {built['gym']:,.0f} rollouts/s) | {built['ours'] / built['gym']:.1f}x | >= 3x |")
    else:
        out.append(f"| records.trajectories, {built['rollouts']:,} rollouts of 8 calls | {built['ours']:,.0f} rollouts/s | "
                   f"(Gym not run: {built.get('gym_skipped')}) |")
    text = "\n".join(out) + "\n"
    print(text)
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "trajectories.md"), "w", encoding="utf-8") as handle:
        handle.write(text)


if __name__ == "__main__":
    main()
