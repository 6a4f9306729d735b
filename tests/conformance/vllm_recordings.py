"""The real vLLM 0.32.0 recordings under ../shared/fixtures/vllm-0.32 (see its SOURCES.md).

Each case holds a request as an agent sends it ("asked") and, where vLLM has something to add,
the same request with the token capture mode's fields added ("added"), each with vLLM's reply
bytes. `ReplayUpstream` answers a request whose body equals one of the recorded requests with its
recorded reply, so the sidecar can be run against exactly what vLLM sent.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from typing import Optional

import pytest

from tests.scripted_upstream import ReceivedRequest, Script, split_every

VLLM_DIR = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "fixtures", "vllm-0.32"))
DIALECTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/responses": "responses",
            "/v1/messages": "messages"}
# SOURCES.md: ids and timestamps are fresh on every call, so asked and added differ there only.
_NORMALISE = [(re.compile(rb'"(id|item_id|call_id|response_id|tool_call_id|request_id)":"[^"]*"'), rb'"\1":"<ID>"'),
              (re.compile(rb'"(created|created_at|completed_at)":\d+'), rb'"\1":0')]


def normalised(body: bytes) -> bytes:
    for pattern, replacement in _NORMALISE:
        body = pattern.sub(replacement, body)
    return body


@dataclass(frozen=True)
class Exchange:
    request: bytes
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def chunked(self) -> bool:
        return any(name.lower() == "transfer-encoding" for name, _ in self.headers)

    def script(self, split: str = "events") -> Script:
        """The recorded reply as a scripted upstream sends it, in pieces cut as ``split`` says."""
        headers = [(name, value) for name, value in self.headers if name.lower() != "transfer-encoding"]
        return Script(status=self.status, reason=self.reason, headers=headers, pieces=pieces(self.body, split),
                      chunked=self.chunked)


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    stream: bool
    added_fields: dict
    asked: Exchange
    added: Optional[Exchange]

    @property
    def dialect(self) -> str:
        return DIALECTS[self.path]


def pieces(body: bytes, split: str) -> list[bytes]:
    """``events``: one piece per SSE event (as vLLM writes them); ``1-byte``, ``7-byte``; ``random`` cut points."""
    if split == "events" and b"\n\n" in body:
        parts = body.split(b"\n\n")
        return [part + b"\n\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    if split == "1-byte":
        return split_every(body, 1)
    if split == "7-byte":
        return split_every(body, 7)
    if split == "random":
        rng = random.Random(len(body))
        cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, 40)))
        return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])]
    return [body]


def _exchange(case_dir: str, variant: str) -> Optional[Exchange]:
    if not os.path.exists(os.path.join(case_dir, f"{variant}.response")):
        return None
    with open(os.path.join(case_dir, f"{variant}.head.json"), encoding="utf-8") as handle:
        head = json.load(handle)
    with open(os.path.join(case_dir, f"{variant}.request.json"), "rb") as handle:
        request = handle.read()
    with open(os.path.join(case_dir, f"{variant}.response"), "rb") as handle:
        body = handle.read()
    return Exchange(request, head["status"], head["reason"], [tuple(pair) for pair in head["headers"]], body)


def load_cases() -> list[Case]:
    manifest = os.path.join(VLLM_DIR, "manifest.json")
    if not os.path.exists(manifest):
        return []
    with open(manifest, encoding="utf-8") as handle:
        entries = json.load(handle)["cases"]
    cases = []
    for entry in entries:
        case_dir = os.path.join(VLLM_DIR, entry["case"])
        asked = _exchange(case_dir, "asked")
        assert asked is not None, entry["case"]
        cases.append(Case(entry["case"], entry["path"], entry["stream"], entry.get("added_fields") or {},
                          asked, _exchange(case_dir, "added")))
    return cases


CASES = load_cases()
CASES_BY_NAME = {case.name: case for case in CASES}
requires_vllm_recordings = pytest.mark.skipif(
    not CASES, reason=f"the vLLM 0.32 recordings are not at {VLLM_DIR} (they live in ../shared, beside a CI checkout)")


def case_params(with_added: bool = False) -> list[object]:
    chosen = [case for case in CASES if case.added is not None or not with_added]
    return [pytest.param(case, id=case.name) for case in chosen] or [pytest.param(None, id="no-recordings")]


class Replay:
    """A responder for `ScriptedUpstream`: the recorded reply of the recorded request sent."""

    def __init__(self, split: str = "events") -> None:
        self.split = split
        self.exchanges: dict[bytes, Exchange] = {}
        for case in CASES:
            for exchange in (case.asked, case.added):
                if exchange is not None:
                    self.exchanges[exchange.request] = exchange
            if case.added is not None:  # With the fields newer than the recordings, which vLLM 0.32 ignores.
                import orjson
                from capture import add_request_fields, token_fields_to_add
                fields = token_fields_to_add(case.dialect, orjson.loads(case.asked.request))
                self.exchanges.setdefault(add_request_fields(case.asked.request, fields), case.added)

    def __call__(self, request: ReceivedRequest) -> Optional[Script]:
        exchange = self.exchanges.get(request.body)
        return exchange.script(self.split) if exchange is not None else None
