"""`mcc ls / show / stats / tail / report / export` on generated capture directories (issue 8)."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest
from click.testing import CliRunner

from proxy import main

from tests.capture_dirs import chat_line, make_capture_dir, token_line
from tests.processes import read_line


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
    assert [orjson.loads(line)["rollout_id"] for line in run("ls", captures, "--json", "--rollout", "*9").splitlines()] == ["rollout-0009"]
    errors = [orjson.loads(line)["rollout_id"] for line in run("ls", captures, "--json", "--error", "upstream_error").splitlines()]
    assert errors == ["rollout-0000", "rollout-0001", "rollout-0002"]
    by_calls = [orjson.loads(line)["rollout_id"] for line in run("ls", captures, "--json", "--sort", "calls").splitlines()]
    assert by_calls[-1] == "rollout-0009", "biggest first: the 2-call rollout is last"
    by_calls = [orjson.loads(line)["rollout_id"] for line in run("ls", captures, "--json", "--sort", "calls", "--reverse").splitlines()]
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
        assert read_line(process.stdout).split()[:2] == ["rollout", "#call"]  # The header: from here on, all is shown.
        with open(path / "r1.capture.jsonl", "ab") as handle:
            handle.write(chat_line(0) + chat_line(1, status=500, error="upstream_error"))
        first = read_line(process.stdout)
        second = read_line(process.stdout)
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert first.split()[:3] == ["r1", "#0", "chat"] and second.split()[:3] == ["r1", "#1", "chat"]
    assert "upstream_error" in second


def test_tail_is_aligned_and_says_the_training_arrays_across_looks(tmp_path):
    """Issue 33, point 9: each cell starts under its header (the widths are fixed: tail prints as
    calls come), and the training arrays column carries the lineage from one look to the next: a
    call written after the first look still extends the one before it."""
    path = tmp_path / "live"
    path.mkdir()
    with open(path / "a-rollout-id-longer-than-its-column-of-24.capture.jsonl", "ab") as handle:
        handle.write(token_line([1, 2, 3], [7, 8], call_id="c0"))
    process = subprocess.Popen([sys.executable, "-m", "proxy", "tail", str(path), "--interval", "0.1", "--from-start"],
                               stdout=subprocess.PIPE, text=True)
    try:
        header = read_line(process.stdout)
        first = read_line(process.stdout)
        with open(path / "a-rollout-id-longer-than-its-column-of-24.capture.jsonl", "ab") as handle:
            handle.write(token_line([1, 2, 3, 7, 8, 50, 51], [9], call_id="c1", turn=1) + chat_line(2))
        second, third = read_line(process.stdout), read_line(process.stdout)
    finally:
        process.terminate()
        process.wait(timeout=10)
    starts = [header.index(name) for name in ("#call", "dialect", "model", "status", "in ", "error", "training arrays")]
    for row in (first, second, third):
        cells = [row[at:].split("  ")[0].strip() for at in starts]
        assert cells[0].startswith("#") and cells[1] == "chat" and cells[4].isdigit(), (header, row)
    assert first.startswith("a-rollout-id…olumn-of-24  #0 "), "a long id cut in the middle to its column"
    assert first[starts[-1]:].rstrip() == "usable"
    assert second[starts[-1]:].rstrip() == "usable, extends #0"
    assert third[starts[-1]:].rstrip() == "-", "a call without token ids"


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


def otlp_requests(path: str) -> list:
    """Every line of an otel-json export as the official OTLP message type (opentelemetry-proto).

    OTLP/JSON writes trace and span ids as hex where protobuf's JSON mapping expects base64 (the
    one difference the OTLP spec makes); they are turned into base64 before parsing, strictly."""
    import base64

    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    parsed = []
    for line in open(path, "rb").read().splitlines():
        request = orjson.loads(line)
        for resource in request["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in span:
                            assert len(span[key]) == (32 if key == "traceId" else 16), span[key]
                            span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
        parsed.append(json_format.ParseDict(request, ExportTraceServiceRequest()))
    return parsed


def test_export_otel_is_one_otlp_request_per_rollout_a_collector_takes(captures, tmp_path):
    """Issue 22, point 6: NDJSON, each line an ExportTraceServiceRequest; a rollout is a trace whose
    root span has the calls as children, with the GenAI attributes."""
    output = str(tmp_path / "spans.ndjson")
    assert run("export", captures, "--format", "otel-json", "-o", output).strip().endswith("60 calls in 3 traces")
    requests = otlp_requests(output)
    assert len(requests) == 3
    for request in requests:
        spans = list(request.resource_spans[0].scope_spans[0].spans)
        root, calls = spans[0], spans[1:]
        assert root.name.startswith("rollout rollout-000") and root.parent_span_id == b"" and len(calls) == 20
        assert {span.trace_id for span in spans} == {root.trace_id}
        assert all(span.parent_span_id == root.span_id and span.kind == span.SPAN_KIND_CLIENT for span in calls)
        assert len({span.span_id for span in spans}) == 21
        assert root.start_time_unix_nano == calls[0].start_time_unix_nano
        assert root.end_time_unix_nano == max(span.end_time_unix_nano for span in calls)
    calls = list(requests[0].resource_spans[0].scope_spans[0].spans)[1:]
    attributes = {a.key: a.value for a in calls[0].attributes}
    assert attributes["gen_ai.operation.name"].string_value == "chat" and calls[0].name == "chat policy"
    assert attributes["gen_ai.provider.name"].string_value == "openai"
    assert attributes["gen_ai.usage.input_tokens"].int_value == 100
    assert attributes["gen_ai.usage.cache_read.input_tokens"].int_value == 64
    assert [v.string_value for v in attributes["gen_ai.response.finish_reasons"].array_value.values] == ["length"]
    assert attributes["gen_ai.conversation.id"].string_value == "rollout-0000"
    failed = calls[9]
    assert failed.status.code == failed.status.STATUS_CODE_ERROR
    assert {a.key: a.value for a in failed.attributes}["error.type"].string_value == "upstream_error"


def test_a_long_rollout_continues_on_the_next_lines(tmp_path):
    from proxy.inspection.export import otel_lines
    from proxy.inspection.tables import call_row

    rows = [call_row("long", index, orjson.loads(chat_line(index))) for index in range(12)]
    output = tmp_path / "spans.ndjson"
    output.write_bytes(b"".join(otel_lines([("long", rows)], spans_per_line=5)))
    requests = otlp_requests(str(output))
    sizes = [len(r.resource_spans[0].scope_spans[0].spans) for r in requests]
    assert sizes == [5, 5, 3], "13 spans (the root and 12 calls), at most 5 a line"
    spans = [span for r in requests for span in r.resource_spans[0].scope_spans[0].spans]
    assert len({span.trace_id for span in spans}) == 1 and all(span.parent_span_id == spans[0].span_id for span in spans[1:])


def test_export_parquet_one_row_per_call(captures, tmp_path):
    pyarrow = pytest.importorskip("pyarrow.parquet", reason="Parquet export needs the 'export' extra (pyarrow)")
    output = str(tmp_path / "calls.parquet")
    run("export", captures, "--format", "parquet", "-o", output)
    table = pyarrow.read_table(output)
    assert table.num_rows == 60 and sum(v or 0 for v in table.column("tokens_in").to_pylist()) == 5400
    assert table.column("tool_calls").to_pylist()[5] == ["search"]


def test_parquet_tells_the_sidecars_replies_from_the_upstreams(tmp_path):
    """Issue 22, point 5: who wrote the reply, why, the upstream's status, the failure, the
    correlation ids; stream_truncated never null; output_text on request."""
    pq = pytest.importorskip("pyarrow.parquet", reason="Parquet export needs the 'export' extra (pyarrow)")
    from records.contract import encode_capture_line

    from tests.capture_dirs import make_conversation_dir

    directory = tmp_path / "c"
    make_conversation_dir(str(directory))
    (directory / "local.capture.jsonl").write_bytes(encode_capture_line({
        "model_call_id": "l", "dialect": "chat", "status_code": 502, "error_category": "connection",
        "request": {"model": "m", "messages": []}, "response": {"error": {"message": "upstream unreachable"}},
        "client_session_id": "sess-1", "client_assistant_message_id": "msg-7", "upstream_attempted": True,
        "response_source": "local", "upstream_status_code": None, "local_response_reason": "upstream_unreachable",
        "failure": {"stage": "upstream_connect", "category": "connection", "message": "connection refused",
                    "exception_type": "ConnectionRefusedError", "retryable": True}}))
    output = str(tmp_path / "calls.parquet")
    run("export", str(directory), "--format", "parquet", "-o", output)
    table = pq.read_table(output)
    assert "output_text" not in table.column_names, "the output text is opt-in"
    rows = {(r["rollout_id"], r["call_index"]): r for r in table.to_pylist()}
    local = rows[("local", 0)]
    assert (local["response_source"], local["local_response_reason"], local["upstream_status_code"],
            local["upstream_attempted"]) == ("local", "upstream_unreachable", None, True)
    assert (local["failure_stage"], local["failure_message"]) == ("upstream_connect", "connection refused")
    assert (local["client_session_id"], local["client_assistant_message_id"]) == ("sess-1", "msg-7")
    assert local["stream_truncated"] is False, "a JSON reply was not truncated: false, not null"
    cut = rows[("conv-chat", 1)]
    assert (cut["stream_truncated"], cut["response_source"], cut["upstream_status_code"]) == (True, "upstream", 200)
    assert cut["failure_message"] == "the upstream closed mid-stream"
    assert table.column("stream_truncated").null_count == 0
    ok = rows[("conv-chat", 0)]
    assert (ok["response_source"], ok["failure_message"], ok["client_session_id"]) == (None, None, None)
    run("export", str(directory), "--format", "parquet", "--output-text", "-o", output)
    texts = {(r["rollout_id"], r["call_index"]): r["output_text"] for r in pq.read_table(output).to_pylist()}
    for dialect in ("chat", "responses", "messages"):
        assert texts[(f"conv-{dialect}", 0)] == "Checking the forecast."
    assert texts[("conv-completions", 0)] == " Checking the forecast."
    assert texts[("conv-chat", 1)] is None and texts[("local", 0)] is None
    run("export", str(directory), "--format", "parquet", "--token-arrays", "-o", output)
    arrays = pq.read_table(output).to_pylist()
    assert all(r["missing"] == ["prompt_token_ids", "generation_token_ids", "generation_log_probs"] for r in arrays), \
        "with --token-arrays, a call without arrays says which are missing"


def invoke(*args: str):
    return CliRunner().invoke(main, list(args), prog_name="mcc")


def assert_one_sentence(result, status: int, *said: str) -> None:
    assert result.exit_code == status, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), "no traceback"
    assert result.output.startswith("mcc: ") and result.output.count("\n") == 1, result.output
    for words in said:
        assert words in result.output, (words, result.output)


def test_the_cli_says_what_is_wrong_in_one_line_never_a_traceback(captures, tmp_path):
    """Issue 22, point 7: a glob or a path as the rollout id, usage errors, unreadable files:
    one line starting `mcc:`, exit 2 for usage."""
    assert_one_sentence(invoke("show", captures, "sdk-*"), 2, "is a pattern, not a rollout id", "--rollout 'sdk-*'", "mcc ls")
    path = os.path.join(captures, "rollout-0000.capture.jsonl")
    assert_one_sentence(invoke("show", captures, path), 2, "is a path, not a rollout id", "'rollout-0000'", "mcc ls")
    assert_one_sentence(invoke("show", captures, "a b"), 2, "is not a rollout id", "mcc ls")
    assert_one_sentence(invoke("tail", captures, "x?"), 2, "is a pattern", "mcc ls")
    assert_one_sentence(invoke("ls", str(tmp_path / "missing")), 2, "is not a directory")
    assert_one_sentence(invoke("ls", captures, "--sort", "size"), 2, "'size' is not one of", "see 'mcc ls --help'")
    assert_one_sentence(invoke("ls"), 2, "Missing argument 'DIR'", "see 'mcc ls --help'")
    bare = invoke()
    assert bare.exit_code == 2 and bare.output.startswith("Usage: mcc") and "mcc: " not in bare.output, "bare mcc: its help"
    assert_one_sentence(invoke("show", captures, "rollout-0000", "--call", "99"), 1, "has no call 99")
    assert_one_sentence(invoke("show", captures, "rollout-0001", "--call", "20"), 1, "unreadable line")
    assert_one_sentence(invoke("export", captures, "--format", "otel-json", "--output-text", "-o", str(tmp_path / "x")), 2,
                        "go with --format parquet")
    locked = tmp_path / "locked"
    make_capture_dir(str(locked), rollouts=1, calls=1)
    if os.geteuid() != 0:  # root reads anything: the unreadable file is only unreadable to others.
        os.chmod(locked / "rollout-0000.capture.jsonl", 0)
        assert_one_sentence(invoke("show", str(locked), "rollout-0000"), 1, "Permission denied")


def test_tables_mark_unreadable_lines_cut_long_ids_and_separate_thousands(captures, tmp_path):
    with open(os.path.join(captures, "rollout-0001.capture.jsonl"), "r+b") as handle:
        data = handle.read()
        handle.seek(0)
        handle.write(data.replace(b"\n", b"\nnot json\n", 1))  # Line 1 is damaged in place.
    shown = run("show", captures, "rollout-0001").splitlines()
    assert shown[2].startswith("1  ") and "(unreadable line: not one JSON object" in shown[2]
    assert shown[3].startswith("2  ") and shown[-1].startswith("21 ") and "(unreadable line" in shown[-1]
    rows = [orjson.loads(line) for line in run("show", captures, "rollout-0001", "--json").splitlines()]
    assert [r["call_index"] for r in rows] == list(range(22))
    assert rows[1] == {"rollout_id": "rollout-0001", "call_index": 1, "unreadable": True}
    listed = run("ls", captures).splitlines()
    assert listed[0].split()[:8] == ["rollout", "calls", "turns", "in", "out", "cached", "errors", "unreadable"]
    assert listed[2].split()[1:5] == ["20", "20", "1,800", "180"] and listed[2].split()[8] == "2"
    long_id = "sdk-" + "x" * 120 + "-end"
    with open(os.path.join(captures, long_id + ".capture.jsonl"), "wb") as handle:
        handle.write(b"".join(chat_line(i, status=500 if i < 3 else 429, error="upstream_error" if i < 3 else "rate_limit")
                              for i in range(5)))
    row = next(line for line in run("ls", captures).splitlines() if line.startswith("sdk-"))
    assert row.startswith(long_id[:24] + "…" + long_id[-23:] + " "), "cut to 48 characters, both ends kept"
    assert "5 (upstream_error:3, rate_limit:2)" in row, "categories by count"
    stats = run("stats", captures)
    assert "calls               65 " in stats and "in 5,400, out 540" in stats


def test_stats_is_quiet_on_stderr_off_a_terminal_and_a_missing_first_token_is_said(tmp_path):
    make_capture_dir(str(tmp_path / "c"), rollouts=250, calls=1)
    done = subprocess.run([sys.executable, "-m", "proxy", "stats", str(tmp_path / "c")], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "" and "rollouts            250" in done.stdout
    from records.contract import encode_capture_line
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "r.capture.jsonl").write_bytes(encode_capture_line(
        {"model_call_id": "x", "dialect": "chat", "status_code": 500, "latency_ms": 5.0, "latency_ttft_ms": None}))
    assert "no first token" in run("show", str(tmp_path / "d"), "r", "--call", "0").splitlines()[0]
    assert "ttft ms             no call had a first token" in run("stats", str(tmp_path / "d"))


def test_the_pyarrow_hint_names_a_command_that_works_from_a_clone():
    from proxy.inspection.export import PYARROW_HINT
    assert "pip install pyarrow" in PYARROW_HINT and "model-call-capture[" not in PYARROW_HINT


def test_small_things_read_as_a_person_reads_them(captures, tmp_path):
    """Issue 33, point 9: `ls` of an empty directory prints no header alone; `stats` says turns as
    integers; `report` gives a small page's size in KB."""
    empty = tmp_path / "empty"
    empty.mkdir()
    listed = CliRunner().invoke(main, ["ls", str(empty)])
    assert listed.stdout == "" and "no capture files" in listed.stderr
    stats = CliRunner().invoke(main, ["stats", captures]).output
    turns = next(line for line in stats.splitlines() if line.startswith("turns per rollout"))
    assert "." not in turns.split("rollout", 1)[1], turns
    done = CliRunner().invoke(main, ["report", captures, "-o", str(tmp_path / "r.html")])
    assert " KB)" in done.output or " MB)" in done.output
