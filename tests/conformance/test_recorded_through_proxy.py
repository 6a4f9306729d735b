"""Every recorded reply, served by a scripted upstream, passes the sidecar byte for byte and is captured right."""

from __future__ import annotations

import random

import orjson
import pytest

from tests.scripted_upstream import Script, split_every
from tests.wire import assert_same_reply, fetch, rollout_url

from .fixtures import EXPECTED_CATEGORIES, TRUNCATED, WHOLE_AT_STOP_REASON, fixture_params, requires_fixtures

pytestmark = [pytest.mark.conformance, requires_fixtures]


def _script(fixture, pieces) -> Script:
    if fixture.kind == "sse":
        return Script(headers=[("Content-Type", "text/event-stream")], pieces=pieces, chunked=True)
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(fixture.body)))]
    return Script(status=fixture.status, reason="Recorded", headers=headers, pieces=pieces)


def _chunkings(body: bytes, name: str) -> dict[str, list[bytes]]:
    rng = random.Random(name)
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, 30)))
    return {"whole": [body], "random": [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])],
            "7-byte": split_every(body, 7) if len(body) < 20_000 else split_every(body, 997)}


@pytest.mark.parametrize("fixture", fixture_params())
async def test_recording_passes_unchanged_and_is_captured(http, upstream, sidecar, store, fixture):
    request = fixture.request or b'{"model": "m"}'
    for number, (chunking, pieces) in enumerate(_chunkings(fixture.body, fixture.name).items()):
        upstream.scripts[fixture.path] = _script(fixture, pieces)
        direct = await fetch(http, "POST", upstream.url + fixture.path, request)
        proxied = await fetch(http, "POST", rollout_url(sidecar.url, f"fx-{number}", fixture.path), request)
        assert_same_reply(direct, proxied)
        (line,) = store.read(f"fx-{number}")
        assert line["dialect"] == fixture.dialect and line["status_code"] == fixture.status
        expected = None if fixture.name in WHOLE_AT_STOP_REASON else EXPECTED_CATEGORIES.get(fixture.name)
        if fixture.status >= 400:
            assert line["error_category"] in {"client_error", "not_found", "rate_limit"}, chunking
            assert line["response"] == orjson.loads(fixture.body)
        else:
            assert line["error_category"] == expected, chunking
        if fixture.kind == "sse":
            # The line is written at the terminal event; anything after it is not part of the call.
            assert fixture.body.decode("utf-8", "replace").startswith(line["response_raw"])
            assert line["response"] is not None and line["stream_truncated"] is (fixture.name in TRUNCATED - WHOLE_AT_STOP_REASON)
        elif fixture.status < 400:
            assert line["response"] == orjson.loads(fixture.body)
