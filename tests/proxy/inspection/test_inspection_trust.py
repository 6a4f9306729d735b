"""Numbers a user can trust, and commands that say what they did (issue 16, points 4-11)."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest
from click.testing import CliRunner

from proxy import main
from records import clear_model_call_captures
from records.contract import encode_capture_line

from tests.capture_dirs import chat_line, make_capture_dir
from tests.processes import read_line


def run(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


def _line(**fields: object) -> bytes:
    return encode_capture_line({"model_call_id": "a", "dialect": "chat", "status_code": 200, **fields})


@pytest.fixture
def mixed(tmp_path) -> str:
    """Six calls: five report usage (cache counts too), one reports none; one Responses call."""
    directory = tmp_path / "mixed"
    directory.mkdir()
    lines = [chat_line(i) for i in range(4)]
    lines.append(_line(response={"object": "chat.completion", "choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]}))
    lines.append(_line(dialect="responses", response={"object": "response", "status": "completed", "output": [],
                                                      "usage": {"input_tokens": 7, "output_tokens": 1,
                                                                "input_tokens_details": {"cached_tokens": 0}}}))
    (directory / "r.capture.jsonl").write_bytes(b"".join(lines))
    (directory / "none.capture.jsonl").write_bytes(_line(response={"choices": [{"message": {"content": "x"}}]}))
    return str(directory)


def test_unreported_tokens_are_dashes_and_nulls_not_zeros(mixed):
    rows = {r["rollout_id"]: r for r in map(orjson.loads, run("ls", mixed, "--json").splitlines())}
    assert (rows["none"]["tokens_in"], rows["none"]["tokens_out"], rows["none"]["cached_tokens"]) == (None, None, None)
    assert rows["r"]["tokens_in"] == 4 * 100 + 7
    table = run("ls", mixed)
    none_row = next(line for line in table.splitlines() if line.startswith("none"))
    assert none_row.split()[1:6] == ["1", "1", "-", "-", "-"]  # calls, turns, in, out, cached


def test_the_cache_hit_ratio_says_its_denominator(mixed):
    stats = orjson.loads(run("stats", mixed, "--json"))
    assert (stats["calls"], stats["calls_with_usage"], stats["calls_with_cache_counts"]) == (7, 5, 5)
    text = run("stats", mixed)
    assert "cache hit ratio     40.0% of the 5 calls that reported cache counts (2 calls did not)" in text
    assert "over the 5 calls that reported usage; 2 did not" in text


def test_finish_means_the_same_everywhere(mixed):
    """finish_reason as in ModelCallRecord (None for a completed Responses call); its status apart."""
    rows = [orjson.loads(line) for line in run("show", mixed, "r", "--json").splitlines()]
    responses = rows[-1]
    assert (responses["finish_reason"], responses["response_status"]) == (None, "completed")
    stats = orjson.loads(run("stats", mixed, "--json"))
    assert "completed" not in stats["finish_reasons"] and stats["response_statuses"] == {"completed": 1}


def test_otel_models_come_from_request_and_reply_and_parquet_times_are_timestamps(tmp_path):
    directory = tmp_path / "c"
    directory.mkdir()
    (directory / "r.capture.jsonl").write_bytes(_line(started_at=1767225600.25, completed_at=1767225601.5,
                                                      request={"model": "alias"},
                                                      response={"model": "Qwen/Qwen3-8B", "choices": []}))
    spans_file, parquet_file = tmp_path / "s.json", tmp_path / "c.parquet"
    run("export", str(directory), "--format", "otel-json", "-o", str(spans_file))
    span = orjson.loads(spans_file.read_bytes())["resourceSpans"][0]["scopeSpans"][0]["spans"][1]  # [0] is the rollout
    attributes = {a["key"]: a["value"] for a in span["attributes"]}
    assert attributes["gen_ai.request.model"] == {"stringValue": "alias"}
    assert attributes["gen_ai.response.model"] == {"stringValue": "Qwen/Qwen3-8B"}
    pq = pytest.importorskip("pyarrow.parquet")
    run("export", str(directory), "--format", "parquet", "-o", str(parquet_file))
    table = pq.read_table(parquet_file)
    assert str(table.schema.field("started_at").type) == "timestamp[us, tz=UTC]"
    assert table.column("started_at").to_pylist()[0].isoformat() == "2026-01-01T00:00:00.250000+00:00"


def test_ls_sorts_biggest_first_and_refuses_an_unknown_category(tmp_path):
    directory = tmp_path / "c"
    make_capture_dir(str(directory), rollouts=3, calls=2)
    with open(directory / "rollout-0001.capture.jsonl", "ab") as handle:
        handle.write(b"".join(chat_line(i) for i in range(10, 15)))
        handle.write(b"".join(chat_line(i, status=500, error="upstream_error") for i in range(15, 18)))
    for key in ("calls", "tokens", "errors", "latency"):
        order = [orjson.loads(line)["rollout_id"] for line in run("ls", str(directory), "--sort", key, "--json").splitlines()]
        assert order[0] == "rollout-0001", key
    result = CliRunner().invoke(main, ["ls", str(directory), "--error", "upstream_eror"])
    assert result.exit_code == 2 and "upstream_eror" in result.output


def test_choices_are_listed_and_there_is_a_version():
    serve_help = run("serve", "--help")
    for listed in ("[debug|info|warning|error]", "[text|json]", "[auto|fsync]"):
        assert listed in serve_help
    assert run("--version").startswith("mcc, version ")


def test_tail_prints_a_header_and_says_when_the_rollout_does_not_exist_yet(tmp_path):
    directory = tmp_path / "c"
    directory.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "proxy", "tail", str(directory), "later", "--interval", "0.1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        header = read_line(process.stdout)
        assert header.split()[:3] == ["rollout", "#call", "dialect"]
        (directory / "later.capture.jsonl").write_bytes(chat_line(0))
        assert read_line(process.stdout).split()[:3] == ["later", "#0", "chat"]
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    assert "has no capture file in" in stderr and "waiting for its first call" in stderr


def test_an_empty_or_missing_directory_is_said(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(main, ["ls", str(empty)])
    assert result.exit_code == 0 and "no capture files in" in result.output
    done = subprocess.run([sys.executable, "-m", "records", str(tmp_path / "missing")], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.strip().endswith("does not exist (a wrong path or an unmounted volume?)")
    done = subprocess.run([sys.executable, "-m", "records", str(empty)], capture_output=True, text=True)
    assert done.returncode == 0 and "no capture files in" in done.stderr


def test_records_cli_ends_quietly_in_a_pipe_and_its_help_is_plain(tmp_path):
    make_capture_dir(str(tmp_path / "c"), rollouts=400, calls=1)
    done = subprocess.run(f"{sys.executable} -m records {tmp_path / 'c'} | head -1", shell=True, capture_output=True, text=True)
    assert done.stdout.count("\n") == 1 and done.stderr == ""
    usage = subprocess.run([sys.executable, "-m", "records", "--help"], capture_output=True, text=True).stdout
    assert usage.startswith("usage: python -m records [--allow-empty] CAPTURES") and "`" not in usage


def test_report_and_export_into_a_missing_directory_are_one_sentence(tmp_path):
    make_capture_dir(str(tmp_path / "c"), rollouts=1, calls=1)
    for args in (["report", str(tmp_path / "c"), "-o", str(tmp_path / "no" / "r.html")],
                 ["export", str(tmp_path / "c"), "--format", "otel-json", "-o", str(tmp_path / "no" / "s.json")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and result.output.strip().count("\n") == 0 and "does not exist" in result.output


def test_show_says_a_413_body_was_not_kept(tmp_path):
    directory = tmp_path / "c"
    directory.mkdir()
    (directory / "big.capture.jsonl").write_bytes(_line(status_code=413, local_response_reason="body_too_large",
                                                        response_source="local", request=None))
    assert "refused unread, and not kept" in run("show", str(directory), "big", "--call", "0")


def test_clear_refuses_one_bare_id(tmp_path):
    (tmp_path / "a.capture.jsonl").write_bytes(b"")
    with pytest.raises(TypeError, match=r"clear_model_call_captures\(\['abc'\], capture_dir\)"):
        clear_model_call_captures("abc", str(tmp_path))
    assert os.path.exists(tmp_path / "a.capture.jsonl"), "nothing was walked character by character"


def test_tail_help_shows_the_rollout_as_optional():
    assert run("tail", "--help").splitlines()[0].endswith(" tail [OPTIONS] DIR [ROLLOUT]")
