"""Helpers to compare what a client receives directly with what it receives through the sidecar."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
from yarl import URL

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}


@dataclass
class Reply:
    status: int
    reason: str
    #: End-to-end headers as raw (name, value) pairs, in order, with the case they arrived in.
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key.lower() == name.lower()), None)


#: The admin token the tests' sidecars are started with (`tests.conftest.start`), as the runner and
#: the trainer hold it; an agent never does (docs/operations.md, "Who may change state").
RUNNER_TOKEN = "runner-token-for-tests"
RUNNER = {"Authorization": f"Bearer {RUNNER_TOKEN}"}


async def fetch(session: aiohttp.ClientSession, method: str, url: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> Reply:
    """One request; the reply body is read chunk by chunk as it arrives."""
    # encoded=True: the URL goes out exactly as written, so tests control every byte of the target.
    async with session.request(method, URL(url, encoded=True), data=body, headers=headers) as response:
        chunks = [chunk async for chunk in response.content.iter_any()]
        return Reply(response.status, response.reason or "", end_to_end(response.raw_headers), b"".join(chunks))


def end_to_end(raw_headers: Any) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw_headers if k.decode("latin-1").lower() not in HOP_BY_HOP]


def assert_same_reply(direct: Reply, proxied: Reply) -> None:
    """Status, reason, end-to-end headers (names, values, order) and body bytes are identical."""
    assert (proxied.status, proxied.reason) == (direct.status, direct.reason)
    assert proxied.headers == direct.headers
    assert proxied.body == direct.body


def rollout_url(sidecar_url: str, rollout_id: str, path: str) -> str:
    return f"{sidecar_url}/ng-rollout/{rollout_id}{path}"


def assert_raw_until_the_end(raw: str, stream: bytes) -> None:
    """``response_raw`` is the stream as read until the reply was whole (docs/wire.md, "Durable
    before the agent's end"): all of it, or all but what follows its last meaningful event (a
    ``[DONE]`` that came in a later read, and the rest of the read that completed it)."""
    text = stream.decode()
    assert text.startswith(raw), "the raw text is the stream's beginning"
    rest = text[len(raw):]
    assert all(marker not in rest for marker in ('"usage"', '"finish_reason":"', "message_delta", "response.completed")), rest
