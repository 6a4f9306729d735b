"""W3C trace context (issue 33, point 8): each captured call goes upstream with a ``traceparent``
naming its rollout's trace and its own span, and `mcc export --format otel-json` writes the call's
span under the same ids, so the upstream's spans of a call (vLLM's) sit under it. The body and the
reply stay byte-exact; an agent's own ``traceparent`` is forwarded instead of ours."""

from __future__ import annotations

import orjson
from click.testing import CliRunner

from proxy import main
from proxy.app import load_settings
from records.contract.writing import traceparent

from tests.scripted_upstream import json_script
from tests.proxy.inspection.test_cli_inspect import otlp_requests
from tests.wire import assert_same_reply, fetch, rollout_url

MESSAGES = "/v1/messages"
REQUEST = orjson.dumps({"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
#: An Anthropic reply that wrote 30 prompt tokens to the cache and read 200 from it.
REPLY = orjson.dumps({
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
    "content": [{"type": "text", "text": "Hello"}], "stop_reason": "end_turn", "stop_sequence": None,
    "usage": {"input_tokens": 5, "cache_read_input_tokens": 200, "cache_creation_input_tokens": 30, "output_tokens": 2}})


async def test_a_captured_call_goes_upstream_with_its_rollouts_traceparent(http, upstream, sidecar, store, capture_dir, tmp_path):
    upstream.scripts[MESSAGES] = json_script(REPLY)
    direct = await fetch(http, "POST", upstream.url + MESSAGES, REQUEST)
    proxied = await fetch(http, "POST", rollout_url(sidecar.url, "r-trace", MESSAGES), REQUEST)
    assert_same_reply(direct, proxied)
    (line,) = store.read("r-trace")
    sent = upstream.received[-1]
    assert sent.body == REQUEST, "the body is forwarded byte for byte"
    assert upstream.received[0].header("traceparent") is None
    header = sent.header("traceparent")
    assert header == traceparent("r-trace", line["model_call_id"])
    version, trace_id, span_id, flags = header.split("-")
    assert (version, flags, len(trace_id), len(span_id)) == ("00", "01", 32, 16)

    # The export's span of the call has exactly those ids: vLLM's spans of it join the trace under it.
    for compat in (False, True):
        output = str(tmp_path / f"spans-{compat}.ndjson")
        result = CliRunner().invoke(main, ["export", capture_dir, "--format", "otel-json", "-o", output,
                                           *(["--otel-compat"] if compat else [])], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        (request,) = otlp_requests(output)
        root, call = request.resource_spans[0].scope_spans[0].spans
        assert (call.trace_id.hex(), call.span_id.hex(), call.parent_span_id) == (trace_id, span_id, root.span_id)
        attributes = {a.key: a.value for a in call.attributes}
        assert attributes["gen_ai.usage.cache_write.input_tokens"].int_value == 30
        assert attributes["gen_ai.usage.cache_read.input_tokens"].int_value == 200
        assert attributes["gen_ai.usage.input_tokens"].int_value == 235
        assert "gen_ai.request.stream" not in attributes and "gen_ai.response.time_to_first_chunk" not in attributes
        if compat:
            assert attributes["gen_ai.usage.cache_creation.input_tokens"].int_value == 30
        else:
            assert "gen_ai.usage.cache_creation.input_tokens" not in attributes


async def test_an_agents_own_traceparent_is_forwarded_alone(http, upstream, sidecar, store):
    upstream.scripts[MESSAGES] = json_script(REPLY)
    own = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await fetch(http, "POST", rollout_url(sidecar.url, "r-own", MESSAGES), REQUEST, {"traceparent": own})
    sent = upstream.received[-1]
    assert [value for name, value in sent.headers if name.lower() == "traceparent"] == [own]
    assert len(store.read("r-own")) == 1


async def test_no_traceparent_when_turned_off_or_not_captured(http, upstream, start, capture_dir):
    upstream.scripts[MESSAGES] = json_script(REPLY)
    off = await start(upstream.url, capture_dir=capture_dir, trace_context=False)
    await fetch(http, "POST", rollout_url(off.url, "r-off", MESSAGES), REQUEST)
    assert upstream.received[-1].header("traceparent") is None
    on = await start(upstream.url, capture_dir=capture_dir)
    await fetch(http, "POST", on.url + MESSAGES, REQUEST)  # No rollout prefix: forwarded as it came.
    assert upstream.received[-1].header("traceparent") is None


def test_trace_context_is_a_setting_from_flag_and_environment():
    assert load_settings({"upstream": "http://u:1"}).trace_context is True
    assert load_settings({"upstream": "http://u:1", "trace_context": False}).trace_context is False
    assert load_settings({"upstream": "http://u:1"}, {"MCC_TRACE_CONTEXT": "false"}).trace_context is False


def test_a_stream_span_says_so_and_its_first_chunk_time_in_seconds():
    from proxy.inspection.export import otel_lines
    from records.store import call_row

    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    response = {"id": "c1", "object": "chat.completion", "model": "m", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}]}
    line = {"model_call_id": "f" * 32, "dialect": "chat", "request": request, "response": response,
            "status_code": 200, "latency_ttft_ms": 250.0, "started_at": 1.0, "completed_at": 2.0}
    (payload,) = otel_lines([("r", [call_row("r", 0, line)])])
    call = orjson.loads(payload)["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    attributes = {a["key"]: a["value"] for a in call["attributes"]}
    assert call["spanId"] == "f" * 16
    assert attributes["gen_ai.request.stream"] == {"boolValue": True}
    assert attributes["gen_ai.response.time_to_first_chunk"] == {"doubleValue": 0.25}
