"""The recorded transcripts under ../shared/fixtures (see its SOURCES.md), loaded for conformance tests.

They are read from there, never copied into this repository; without ../shared the suite skips.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

import pytest

FIXTURES_DIR = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "fixtures"))
DIALECTS = {"openai-responses": "responses", "openai-chat": "chat", "anthropic": "messages"}
PATHS = {"responses": "/v1/responses", "chat": "/v1/chat/completions", "messages": "/v1/messages"}

# Categories that differ from "success" (None) for a 2xx recording, each checked against SOURCES.md.
EXPECTED_CATEGORIES = {
    "incomplete_max_output_tokens_gpt5nano": "incomplete",  # response.incomplete terminal
    "nonstream_incomplete_gpt5nano": "incomplete",  # status: incomplete
    "error_insufficient_quota_failed_gpt5nano": "upstream_error",  # error event + response.failed
    "groq_gptoss_error_midstream": "upstream_error",  # data: {"error": ...} in a chat stream
    "openrouter_error_midstream_after_length": "upstream_error",  # same, after finish_reason=length
    # These two recordings lost the blank line after their last event (message_stop): by the
    # WHATWG rules an unterminated event is never dispatched, so the terminal is not seen.
    "text_then_tool_use_sonnet4": "stream_truncated",
    "max_tokens_mid_tool_input_sonnet37": "stream_truncated",
}
# Recordings that end without their dialect's terminal event. (A chat stream's error event is a
# terminal: the SDK stops there, so groq_gptoss_error_midstream, which has no [DONE], is whole.)
TRUNCATED = {"text_then_tool_use_sonnet4", "max_tokens_mid_tool_input_sonnet37"}
# Through the sidecar a Messages reply is whole at its ``message_delta`` with the stop reason (only
# ``message_stop`` follows; issue 55, docs/wire.md): those two recordings are complete there.
WHOLE_AT_STOP_REASON = {"text_then_tool_use_sonnet4", "max_tokens_mid_tool_input_sonnet37"}


@dataclass(frozen=True)
class Fixture:
    name: str
    dialect: str
    kind: str  # "sse" or "json"
    status: int
    body: bytes
    request: bytes | None

    @property
    def path(self) -> str:
        return PATHS[self.dialect]


def _status(recorded: object) -> int:
    """The HTTP status; SOURCES.md gives the expected one where the recording did not store it."""
    if isinstance(recorded, int):
        return recorded
    found = re.search(r"\b([1-5]\d\d)\b", str(recorded))
    return int(found.group(1)) if found else 200


def load_fixtures() -> list[Fixture]:
    manifest_path = os.path.join(FIXTURES_DIR, "manifest.json")
    if not os.path.exists(manifest_path):
        return []
    with open(manifest_path, encoding="utf-8") as handle:
        manifest = json.load(handle)
    fixtures = []
    for entry in manifest:
        body_file = next(f for f in entry["files"] if not f.endswith(".request.json"))
        request_file = next((f for f in entry["files"] if f.endswith(".request.json")), None)
        fixtures.append(Fixture(
            name=entry["name"], dialect=DIALECTS[entry["dialect"]], kind=entry["kind"], status=_status(entry["http_status"]),
            body=_read(body_file), request=_read(request_file) if request_file else None,
        ))
    return fixtures


def _read(relative: str) -> bytes:
    with open(os.path.join(FIXTURES_DIR, relative), "rb") as handle:
        return handle.read()


FIXTURES = load_fixtures()
requires_fixtures = pytest.mark.skipif(
    not FIXTURES, reason=f"recorded transcripts not found at {FIXTURES_DIR} (they live in ../shared, beside a CI checkout)")


def fixture_params(kind: str | None = None) -> list[object]:
    chosen = [f for f in FIXTURES if kind is None or f.kind == kind]
    return [pytest.param(f, id=f"{f.dialect}/{f.name}") for f in chosen] or [pytest.param(None, id="no-fixtures")]
