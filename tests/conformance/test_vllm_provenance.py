"""Which engine served each call, read from real vLLM 0.32.0 replies through the sidecar (docs/records.md):
the fingerprint, the engine and version it names, and the cache counts vLLM reports, on the record,
the call row; streamed and not, with and without the token capture mode."""

from __future__ import annotations

import orjson
import pytest

from records import read_model_call_records
from records.store import call_row
from tests.wire import fetch, rollout_url

from .vllm_recordings import Replay, case_params, requires_vllm_recordings

pytestmark = [pytest.mark.conformance, requires_vllm_recordings]


@pytest.mark.parametrize("capture_tokens", [False, True])
@pytest.mark.parametrize("case", case_params())
async def test_every_call_says_which_engine_served_it(http, upstream, start, capture_dir, store, case, capture_tokens):
    upstream.responder = Replay("random")
    sidecar = await start(upstream.url, capture_dir=capture_dir, capture_tokens=capture_tokens)
    await fetch(http, "POST", rollout_url(sidecar.url, "served", case.path), case.asked.request)
    (record,) = read_model_call_records(store, "served")
    (line,) = store.read("served")
    row = call_row("served", 0, line)
    if b'"system_fingerprint"' not in case.asked.body:  # vLLM's Responses and Messages name none.
        assert (record.system_fingerprint, record.engine, row.system_fingerprint) == (None, None, None)
        return
    assert record.system_fingerprint == row.system_fingerprint == "vllm-0.32.0-870eb8ba"
    assert (record.engine, record.engine_version) == (row.engine, row.engine_version) == ("vllm", "0.32.0")
    if b'"created_cache_tokens":0' in case.asked.body:
        assert record.created_cache_tokens == row.created_cache_tokens == 0
    assert record.multimodal_tokens is None, "vLLM sent null: not a made-up 0"
    assert record.engine_metrics is None, "vLLM sent null without --enable-per-request-metrics"


def test_a_chat_reply_recorded_by_vllm_reads_the_same_without_the_sidecar():
    """The record reads the reply's own fields: the fixture's JSON reply, built directly."""
    from records import build_model_call_record

    from .vllm_recordings import CASES_BY_NAME

    case = CASES_BY_NAME["chat"]
    record = build_model_call_record({"response": orjson.loads(case.asked.body), "dialect": "chat"}, 0)
    assert (record.engine, record.engine_version, record.created_cache_tokens) == ("vllm", "0.32.0", 0)


def test_every_recorded_fingerprint_names_its_engine_where_it_has_vllms_shape():
    """Every ``system_fingerprint`` in the recorded replies (../shared/fixtures): vLLM's shapes
    (``vllm-0.32.0-870eb8ba``, and a tensor-parallel deployment's ``vllm-0.24.0-tp4-6d31f84d``)
    name the engine and its version; OpenAI's (``fp_...``) name none."""
    import os
    import re

    from records import build_model_call_record

    from .fixtures import FIXTURES_DIR

    if not os.path.isdir(FIXTURES_DIR):
        pytest.skip("the recorded replies (../shared/fixtures) are not beside this checkout")
    seen = set()
    for directory, _, names in os.walk(FIXTURES_DIR):
        for name in names:
            with open(os.path.join(directory, name), "rb") as handle:
                seen.update(re.findall(rb'"system_fingerprint": ?"([^"]+)"', handle.read()))
    assert b"vllm-0.24.0-tp4-6d31f84d" in seen and b"vllm-0.32.0-870eb8ba" in seen
    for fingerprint in sorted(seen):
        record = build_model_call_record({"response": {"object": "chat.completion", "choices": [],
                                                       "system_fingerprint": fingerprint.decode()}}, 0)
        if fingerprint.startswith(b"vllm-"):
            assert record.engine == "vllm" and record.engine_version == fingerprint.decode().split("-")[1], fingerprint
        else:
            assert (record.engine, record.engine_version) == (None, None), fingerprint
