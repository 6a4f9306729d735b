"""Which engine served each call (docs/records.md): `mcc show` says it, `mcc stats` counts the calls per
engine fingerprint and names the rollouts more than one engine served, the Parquet export has the
columns, and `records` reads vLLM's per-request metrics as the engine wrote them."""

from __future__ import annotations

import os

import orjson
import pytest

from records import build_model_call_record
from records.contract import encode_capture_line

from tests.capture_dirs import chat_line
from tests.proxy.inspection.test_cli_inspect import run

OLD, NEW = "vllm-0.32.0-870eb8ba", "vllm-0.34.1-1f2e3d4c"


def _served(index: int, fingerprint: str) -> bytes:
    line = orjson.loads(chat_line(index))
    line["response"]["system_fingerprint"] = fingerprint
    line["response"]["usage"]["prompt_tokens_details"].update(created_cache_tokens=36, multimodal_tokens=0)
    return encode_capture_line(line)


@pytest.fixture
def upgraded(tmp_path) -> str:
    """rollout-a: two calls on the old engine; rollout-b: one on the old, one on the new (an upgrade mid-rollout)."""
    with open(os.path.join(tmp_path, "rollout-a.capture.jsonl"), "wb") as handle:
        handle.write(_served(0, OLD) + _served(1, OLD))
    with open(os.path.join(tmp_path, "rollout-b.capture.jsonl"), "wb") as handle:
        handle.write(_served(0, OLD) + _served(1, NEW))
    return str(tmp_path)


def test_stats_names_the_rollouts_more_than_one_engine_served(upgraded):
    said = run("stats", upgraded)
    assert f"engines             {OLD} 3, {NEW} 1 calls" in said
    assert "1 rollout(s) served by more than one engine fingerprint" in said and "rollout-b" in said
    totals = orjson.loads(run("stats", upgraded, "--json"))
    assert totals["calls_by_engine_fingerprint"] == {OLD: 3, NEW: 1}
    assert totals["rollouts_with_several_engines"] == ["rollout-b"]


def test_stats_says_nothing_of_engines_when_no_reply_named_one(tmp_path):
    with open(os.path.join(tmp_path, "r.capture.jsonl"), "wb") as handle:
        handle.write(chat_line(0))
    assert "engines" not in run("stats", str(tmp_path))


def test_show_says_which_engine_served_the_call(upgraded):
    assert f"served by vllm 0.34.1 (system_fingerprint {NEW})" in run("show", upgraded, "rollout-b", "--call", "1")


def test_parquet_has_the_provenance_columns(upgraded, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="Parquet export needs the 'export' extra (pyarrow)")
    output = str(tmp_path / "calls.parquet")
    run("export", upgraded, "--format", "parquet", "-o", output)
    table = pq.read_table(output).to_pydict()
    by_call = sorted(zip(table["rollout_id"], table["call_index"], table["system_fingerprint"], table["engine"],
                         table["engine_version"], table["created_cache_tokens"], table["multimodal_tokens"]))
    assert by_call[-1] == ("rollout-b", 1, NEW, "vllm", "0.34.1", 36, 0)


@pytest.mark.parametrize("fingerprint, engine, version", [
    ("vllm-0.32.0-870eb8ba", "vllm", "0.32.0"),
    ("vllm-0.24.0-tp4-6d31f84d", "vllm", "0.24.0"),  # A tensor-parallel deployment (a recorded fixture's).
    ("vllm-0.24.0-tp4-pp2-6d31f84d", "vllm", "0.24.0"),
    ("vllm-0.11.0rc2.dev5+g1a2b3c-0123abcd", "vllm", "0.11.0rc2.dev5+g1a2b3c"),
    ("fp_44709d6fcb", None, None),  # OpenAI's: a fingerprint, no engine named.
    ("", None, None),
])
def test_the_engine_and_version_are_read_from_the_fingerprint_where_it_names_them(fingerprint, engine, version):
    record = build_model_call_record({"response": {"object": "chat.completion", "choices": [],
                                                   "system_fingerprint": fingerprint}}, 0)
    assert (record.engine, record.engine_version) == (engine, version)
    assert record.system_fingerprint == (fingerprint or None)


def test_vllms_per_request_metrics_are_kept_as_the_engine_wrote_them():
    metrics = {"queue_time": 0.002, "time_to_first_token": 0.031, "inter_token_latency": [0.01, 0.012]}
    record = build_model_call_record({"response": {"object": "chat.completion", "choices": [], "metrics": metrics,
                                                   "usage": {"prompt_tokens": 3, "prompt_tokens_details": {
                                                       "created_cache_tokens": -1, "multimodal_tokens": 5}}}}, 0)
    assert record.engine_metrics == metrics
    assert (record.created_cache_tokens, record.multimodal_tokens) == (None, 5), "a negative count is not a count"


def test_vllms_multimodal_tokens_by_modality_are_kept_as_the_mapping_beside_their_sum():
    from records.store import call_row

    usage = {"prompt_tokens": 700, "prompt_tokens_details": {"multimodal_tokens": {"image": 576, "audio": 40}}}
    line = {"response": {"object": "chat.completion", "choices": [], "usage": usage,
                         "metrics": {"queue_time": 0.002}}}
    record = build_model_call_record(line, 0)
    assert record.multimodal_tokens_by_modality == {"image": 576, "audio": 40} and record.multimodal_tokens == 616
    row = call_row("r", 0, line)
    assert orjson.loads(row.multimodal_tokens_by_modality) == {"image": 576, "audio": 40}
    assert orjson.loads(row.engine_metrics) == {"queue_time": 0.002}, "a Parquet column of its own"


@pytest.fixture
def multimodal(tmp_path) -> str:
    """Two calls with vLLM's mapping by modality and its per-request metrics, one with a bare count."""
    lines = []
    for index, (found, metrics) in enumerate([({"image": 576, "audio": 40}, {"queue_time": 0.002, "ttft": 0.03}),
                                              (12, {"queue_time": 0.004, "ttft": 0.05})]):
        line = orjson.loads(chat_line(index))
        line["response"]["usage"]["prompt_tokens_details"]["multimodal_tokens"] = found
        line["response"]["metrics"] = metrics
        lines.append(encode_capture_line(line))
    with open(os.path.join(tmp_path, "mm.capture.jsonl"), "wb") as handle:
        handle.write(b"".join(lines))
    return str(tmp_path)


def test_show_says_the_multimodal_tokens_by_modality_and_the_engines_metrics(multimodal):
    said = run("show", multimodal, "mm", "--call", "0")
    assert "multimodal prompt tokens 616 (image 576, audio 40)" in said
    assert "engine metrics queue_time 0.002, ttft 0.03" in said
    assert "multimodal prompt tokens 12\n" in run("show", multimodal, "mm", "--call", "1")


def test_stats_sums_the_multimodal_tokens_by_modality_and_means_the_engines_metrics(multimodal):
    said = run("stats", multimodal)
    assert "multimodal tokens   audio 40, image 576, unnamed 12 prompt tokens" in said
    assert "engine metrics      2 calls; mean queue_time 0.003, ttft 0.04" in said
    totals = orjson.loads(run("stats", multimodal, "--json"))
    assert totals["multimodal_tokens_by_modality"] == {"image": 576, "audio": 40, "unnamed": 12}
    assert totals["calls_with_engine_metrics"] == 2
