"""Token and cache counts across the three usage shapes (docs/records.md; the seed's `_prompt_size` rules)."""

from __future__ import annotations

import pytest

from records import _cache_signal, _prompt_size, _token_count, _usage_detail_token, extract_token_stats

CASES = [
    # (case, usage, tokens_in, tokens_out, cached_tokens, cache_hit, cache_creation_tokens)
    ("chat without cache details", {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
     100, 20, None, None, None),
    ("chat with cached details (a subset, not added)",
     {"prompt_tokens": 100, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 64}}, 100, 20, 64, True, None),
    ("chat prompt_tokens beside gateway-added Anthropic cache fields: prompt_tokens wins",
     {"prompt_tokens": 100, "completion_tokens": 5, "cache_read_input_tokens": 60, "cache_creation_input_tokens": 10},
     100, 5, 60, True, 10),
    ("anthropic input + cache read + cache creation",
     {"input_tokens": 100, "cache_read_input_tokens": 200, "cache_creation_input_tokens": 30, "output_tokens": 7},
     330, 7, 200, True, 30),
    ("anthropic fully cached", {"input_tokens": 0, "cache_read_input_tokens": 500, "cache_creation_input_tokens": 0, "output_tokens": 3},
     500, 3, 500, True, 0),
    ("zero-only cache fields", {"input_tokens": 12, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0, "output_tokens": 1},
     12, 1, 0, False, 0),
    ("responses input with cached details (not added)",
     {"input_tokens": 4012, "input_tokens_details": {"cached_tokens": 4000}, "output_tokens": 9,
      "output_tokens_details": {"reasoning_tokens": 4}}, 4012, 9, 4000, True, None),
    ("missing usage", None, None, None, None, None, None),
    ("empty usage", {}, None, None, None, None, None),
    ("bool counts are not counts", {"prompt_tokens": True, "completion_tokens": False}, None, None, None, None, None),
    ("float counts are not counts", {"prompt_tokens": 10.0, "completion_tokens": 2.5}, None, None, None, None, None),
    ("negative counts are not counts", {"input_tokens": -1, "output_tokens": -5, "cache_read_input_tokens": -2},
     None, None, None, None, None),
    ("string counts are not counts", {"prompt_tokens": "100", "completion_tokens": "2"}, None, None, None, None, None),
]


@pytest.mark.parametrize("case,usage,tokens_in,tokens_out,cached,hit,creation", CASES, ids=[c[0] for c in CASES])
def test_token_stats(case, usage, tokens_in, tokens_out, cached, hit, creation):
    stats = extract_token_stats(usage)
    assert (stats["tokens_in"], stats["tokens_out"], stats["cached_tokens"], stats["cache_hit"],
            stats["cache_creation_tokens"]) == (tokens_in, tokens_out, cached, hit, creation)


def test_reasoning_tokens_from_either_details_group():
    assert extract_token_stats({"output_tokens_details": {"reasoning_tokens": 448}})["tokens_reasoning"] == 448
    assert extract_token_stats({"completion_tokens_details": {"reasoning_tokens": 12}})["tokens_reasoning"] == 12
    assert extract_token_stats({"completion_tokens": 3})["tokens_reasoning"] is None  # vLLM: not reported


def test_total_is_reported_or_derived_only_from_known_counts():
    assert extract_token_stats({"prompt_tokens": 3, "completion_tokens": 4})["tokens_total"] == 7
    assert extract_token_stats({"prompt_tokens": 3})["tokens_total"] is None
    assert extract_token_stats({"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 9})["tokens_total"] == 9


def test_helpers_directly():
    assert [_token_count(v) for v in (0, 5, -1, True, 2.0, "3", None)] == [0, 5, None, None, None, None, None]
    usage = {"prompt_tokens_details": {"cached_tokens": "x"}, "input_tokens_details": {"cached_tokens": 8}}
    assert _usage_detail_token(usage, ("prompt_tokens_details", "input_tokens_details"), ("cached_tokens",)) == 8
    assert _prompt_size({"input_tokens": 10}) == 10
    assert _prompt_size({"completion_tokens": 10}) is None
    assert _cache_signal("not a mapping") == (None, None)
    assert _cache_signal({"input_tokens_details": {"cached_tokens": 0}}) == (False, 0)
