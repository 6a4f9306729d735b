"""Micro-benchmark: `read_model_call_records` over 100,000 capture lines of about 2 KB, one core.

    python benchmarks/bench_records.py [--quick] [--lines N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from records import CaptureStore, read_model_call_records  # noqa: E402
from records.contract import encode_capture_line  # noqa: E402


def make_line(number: int) -> bytes:
    """A realistic chat call: a prompt of a few messages, a reply with a tool call, usage."""
    request = {"model": "Qwen/Qwen3-8B", "temperature": 0.7, "messages": [
        {"role": "system", "content": "You are a careful agent. " * 12},
        {"role": "user", "content": f"Task {number}: find the weather and summarise it. " * 6}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]}
    response = {"id": f"chatcmpl-{number}", "object": "chat.completion", "created": 1767225600, "model": "Qwen/Qwen3-8B",
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": "Checking the weather now. " * 4, "reasoning": "The user wants weather. " * 4,
                    "tool_calls": [{"id": f"call_{number}", "type": "function",
                                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}}],
                "usage": {"prompt_tokens": 412, "completion_tokens": 57, "total_tokens": 469,
                          "prompt_tokens_details": {"cached_tokens": 384}}}
    return encode_capture_line({"model_call_id": f"{number:032x}", "dialect": "chat",
                                "model_ref": {"type": "responses_api_models", "name": "policy"},
                                "started_at": 1767225600.0 + number, "completed_at": 1767225600.5 + number,
                                "latency_ms": 512.25, "latency_ttft_ms": 40.5, "status_code": 200, "error_category": None,
                                "request": request, "response": response, "upstream_attempted": True,
                                "response_source": "upstream", "upstream_status_code": 200, "local_response_reason": None})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="10,000 lines (a smoke test of the harness)")
    parser.add_argument("--lines", type=int, default=None, help="how many capture lines (default 100,000)")
    args = parser.parse_args()
    lines = args.lines or (10_000 if args.quick else 100_000)
    with tempfile.TemporaryDirectory() as directory:
        data = b"".join(make_line(n) for n in range(lines))
        with open(os.path.join(directory, "bench.capture.jsonl"), "wb") as handle:
            handle.write(data)
        store = CaptureStore(directory)
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            records = read_model_call_records(store, "bench")
            best = min(best, time.perf_counter() - started)
            assert len(records) == lines and records[-1].tokens_in == 412
            del records  # Freed outside the timed region.
    print(f"# read_model_call_records, one core, Python {sys.version.split()[0]}\n")
    print("| lines | mean line bytes | seconds | records/s | MB/s |")
    print("|---:|---:|---:|---:|---:|")
    print(f"| {lines:,} | {len(data) // lines:,} | {best:.2f} | {lines / best:,.0f} | {len(data) / best / 1e6:.1f} |")


if __name__ == "__main__":
    main()
