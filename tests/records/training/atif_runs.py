"""Captured rollouts to export as ATIF, shared by the ATIF tests here and Gym's validation of them."""

from __future__ import annotations

import os

from records.contract import encode_capture_line

from tests.capture_dirs import make_conversation_dir, make_token_dir


def make_atif_dir(path: str) -> list[str]:
    """Every dialect's tool-calling turn (``conv-<dialect>``), token-mode rollouts with their arrays
    (``rl-*``), and a rollout whose harness ran a sub-agent (``agents``); the rollout ids."""
    make_conversation_dir(path)
    make_token_dir(path, rollouts=2, calls=3, tokens=4)
    lines = [
        {"model_call_id": "main-0", "dialect": "chat", "status_code": 200, "started_at": 1767225600.0,
         "client_agent_id": "lead", "request": {"model": "policy", "messages": [{"role": "user", "content": "Plan it."}]},
         "response": {"object": "chat.completion", "model": "policy", "choices": [
             {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Delegating."}}]}},
        {"model_call_id": "sub-0", "dialect": "chat", "status_code": 200, "started_at": 1767225601.0,
         "client_agent_id": "scout", "client_parent_agent_id": "lead",
         "request": {"model": "small", "messages": [{"role": "user", "content": "Find the file."}]},
         "response": {"object": "chat.completion", "model": "small", "choices": [
             {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "src/a.py"}}]}},
    ]
    with open(os.path.join(path, "agents.capture.jsonl"), "wb") as handle:
        handle.write(b"".join(encode_capture_line(line) for line in lines))
    return sorted(name.removesuffix(".capture.jsonl") for name in os.listdir(path) if name.endswith(".capture.jsonl"))
