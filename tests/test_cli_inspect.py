"""`mcc ls / show / stats / tail / report / export` on generated capture directories (issue 8)."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest
from click.testing import CliRunner

from proxy import main

from .capture_dirs import chat_line, make_capture_dir
from .processes import read_line


@pytest.fixture
def captures(tmp_path) -> str:
    path = str(tmp_path / "captures")
    make_capture_dir(path, rollouts=3, calls=20)
    with open(os.path.join(path, "rollout-0001.capture.jsonl"), "ab") as handle:
        handle.write(b'{"torn')
    open(os.path.join(path, "rollout-0002.capture.incomplete"), "wb").close()
    return path


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_ls_lists_every_rollout_with_its_numbers(captures):
    rows = [orjson.loads(line) for line in run("ls", captures, "--json").splitlines()]
    assert [r["rollout_id"] for r in rows] == ["rollout-0000", "rollout-0001", "rollout-0002"]
    first = rows[0]
    assert (first["calls"], first["tokens_in"], first["tokens_out"], first["cached_tokens"], first["errors"]) == (20, 1800, 180, 640, 2)
    assert first["first_call_at"] == 1767225600.0 and first["last_call_at"] == 1767225619.0
    assert [r["incomplete"] for r in rows] == [False, False, True] and rows[1]["unreadable_lines"] == 1
    table = run("ls", captures)
    assert "rollout-0002" in table.splitlines()[3] and table.splitlines()[3].rstrip().endswith("yes")


def test_ls_filters_and_sorts(captures, tmp_path):
    with open(os.path.join(captures, "rollout-0009.capture.jsonl"), "wb") as handle:
        handle.write(chat_line(0) + chat_line(1))
    assert [orjson.loads(l)["rollout_id"] for l in run("ls", captures, "--json", "--rollout", "*9").splitlines()] == ["rollout-0009"]
    errors = [orjson.loads(l)["rollout_id"] for l in run("ls", captures, "--json", "--error", "upstream_error").splitlines()]
    assert errors == ["rollout-0000", "rollout-0001", "rollout-0002"]
    by_calls = [orjson.loads(l)["rollout_id"] for l in run("ls", captures, "--json", "--sort", "calls").splitlines()]
    assert by_calls[-1] == "rollout-0009", "biggest first: the 2-call rollout is last"
    by_calls = [orjson.loads(l)["rollout_id"] for l in run("ls", captures, "--json", "--sort", "calls", "--reverse").splitlines()]
    assert by_calls[0] == "rollout-0009"


def test_show_lists_calls_in_order_and_prints_one_call(captures):
    rows = [orjson.loads(line) for line in run("show", captures, "rollout-0000", "--json").splitlines()]
    assert [r["call_index"] for r in rows] == list(range(20))
    assert rows[9]["status_code"] == 500 and rows[9]["error_category"] == "upstream_error"
    assert rows[5]["tool_calls"] == ["search"] and rows[5]["invalid_tool_arguments"] == 0
    assert rows[0]["invalid_tool_arguments"] == 1 and rows[4]["finish_reason"] == "length"
    one = run("show", captures, "rollout-0000", "--call", "3")
    assert "--- request ---" in one and '"question 3"' in one and "--- response ---" in one
    assert orjson.loads(run("show", captures, "rollout-0000", "--call", "3", "--json"))["model_call_id"] == f"{3:032x}"
    result = CliRunner().invoke(main, ["show", captures, "nope"])
    assert result.exit_code != 0 and "no capture file" in result.output


def test_stats_add_up(captures):
    stats = orjson.loads(run("stats", captures, "--json"))
    assert (stats["rollouts"], stats["calls"], stats["incomplete_rollouts"], stats["unreadable_lines"]) == (3, 60, 1, 1)
    assert stats["tokens_in"] == 5400 and stats["cached_tokens"] == 1920  # The 500s report no usage.
    assert stats["error_categories"] == {"upstream_error": 6}
    assert stats["finish_reasons"]["length"] == 15  # calls 0, 4, 8, 12, 16 of each rollout
    assert stats["tool_calls"] == 12 and stats["tool_calls_with_invalid_arguments"] == 6
    assert stats["latency_ms"] == {"p50": 509.0, "p90": 517.0, "p99": 519.0}
    assert stats["turns_per_rollout"]["p50"] == 20.0
    assert abs(stats["cache_hit_ratio"] - 30 / 54) < 1e-9
    text = run("stats", captures)
    assert "cut by length       15 of 60 calls" in text and "6 with arguments that are not valid JSON" in text


def test_tail_follows_new_calls(tmp_path):
    path = tmp_path / "live"
    path.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "proxy", "tail", str(path), "--interval", "0.1"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert read_line(process.stdout).startswith("rollout #call ")  # The header: from here on, all is shown.
        with open(path / "r1.capture.jsonl", "ab") as handle:
            handle.write(chat_line(0) + chat_line(1, status=500, error="upstream_error"))
        first = read_line(process.stdout)
        second = read_line(process.stdout)
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert first.startswith("r1 #0 chat") and second.startswith("r1 #1 chat") and "upstream_error" in second


def test_report_is_a_page_with_its_payloads_beside_it(captures, tmp_path):
    """Summaries in the page; each rollout's payloads in report_files/, loaded when a call is opened."""
    output = str(tmp_path / "report.html")
    run("report", captures, "-o", output)
    page = open(output, encoding="utf-8").read()
    assert "http://" not in page.split('<script id="data"')[0] and "https://" not in page
    assert page.count("rollout-000") >= 3 and "question 3" not in page, "no payload in the page"
    payloads = "".join(open(tmp_path / "report_files" / name, encoding="utf-8").read()
                       for name in sorted(os.listdir(tmp_path / "report_files")))
    assert "question 3" in payloads and payloads.startswith("window.mccPayloads(")


def test_export_otel_json_spans(captures, tmp_path):
    output = str(tmp_path / "spans.json")
    run("export", captures, "--format", "otel-json", "-o", output)
    spans = orjson.loads(open(output, "rb").read())["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert len(spans) == 60
    attributes = {a["key"]: a["value"] for a in spans[0]["attributes"]}
    assert attributes["gen_ai.usage.input_tokens"] == {"intValue": "100"}
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == {"intValue": "64"}
    assert attributes["gen_ai.response.finish_reasons"] == {"arrayValue": {"values": [{"stringValue": "length"}]}}
    assert len({s["traceId"] for s in spans}) == 3 and spans[9]["status"]["code"] == 2


def test_export_parquet_one_row_per_call(captures, tmp_path):
    pyarrow = pytest.importorskip("pyarrow.parquet", reason="Parquet export needs the 'export' extra (pyarrow)")
    output = str(tmp_path / "calls.parquet")
    run("export", captures, "--format", "parquet", "-o", output)
    table = pyarrow.read_table(output)
    assert table.num_rows == 60 and sum(v or 0 for v in table.column("tokens_in").to_pylist()) == 5400
    assert table.column("tool_calls").to_pylist()[5] == ["search"]
