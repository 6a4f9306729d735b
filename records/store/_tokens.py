"""Token and cache counts across Responses, Chat Completions and Anthropic Messages usage (docs/records.md).

A count the provider did not report stays ``None``, never 0; counts are ints >= 0, never bools or
floats. ``tokens_in`` is the whole prompt with cached tokens counted exactly once.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

_CACHED_DETAIL_GROUPS = ("prompt_tokens_details", "input_tokens_details")
_REASONING_DETAIL_GROUPS = ("output_tokens_details", "completion_tokens_details")
# NeMo Gym 0.7.0 also reads these aliases (some OpenAI-compatible gateways write them), at the
# top level of usage and inside the details objects.
_CACHED_FIELDS = ("cached_tokens", "cached_input_tokens")
_REASONING_FIELDS = ("reasoning_tokens", "reasoning_output_tokens")


def _token_count(value: Any) -> int | None:
    """``value`` when it is a real token count (an int >= 0 that is not a bool), else None."""
    if type(value) is int and value >= 0:  # type() rejects bools, which are ints too.
        return value
    return None


def _usage_detail_token(usage: Mapping[str, Any], detail_groups: tuple[str, ...],
                        field_names: tuple[str, ...]) -> int | None:
    """Return the first valid token count across equivalent provider detail shapes."""
    for group in detail_groups:
        details = usage.get(group)
        if details is not None and (type(details) is dict or isinstance(details, Mapping)):
            for name in field_names:
                count = _token_count(details.get(name))
                if count is not None:
                    return count
    return None


def _prompt_size(usage: Mapping[str, Any]) -> int | None:
    """Return the whole prompt size, with cached tokens counted exactly once.

    ``prompt_tokens`` (Chat) includes the cache and wins whenever present (the seed's rule, even
    beside Anthropic cache fields a gateway added); ``input_tokens`` with top-level
    ``cache_read_input_tokens`` / ``cache_creation_input_tokens`` (Anthropic) excludes it, so those
    are added; ``input_tokens`` alone (Responses) includes it. A fully cached Anthropic prompt may
    come without ``input_tokens``: then the prompt is the cache sum, as NeMo Gym counts it, unless
    that sum is 0 (zero cache fields alone say nothing about the prompt). ``*_tokens_details``
    cache counts are subsets and never added.
    """
    prompt = _token_count(usage.get("prompt_tokens"))
    if prompt is not None:
        return prompt
    input_tokens = _token_count(usage.get("input_tokens"))
    cache_read = _token_count(usage.get("cache_read_input_tokens"))
    cache_creation = _token_count(usage.get("cache_creation_input_tokens"))
    if input_tokens is None:
        cache_total = (cache_read or 0) + (cache_creation or 0)
        return cache_total if cache_total > 0 else None
    return input_tokens + (cache_read or 0) + (cache_creation or 0)


def _cache_signal(usage: Any) -> tuple[bool | None, int | None]:
    """Cache hit/miss + cached-token count, from usage cache fields (OpenAI / Anthropic)."""
    if not (isinstance(usage, dict) or isinstance(usage, Mapping)):
        return None, None
    cached = _cached_count(usage)
    if cached is None:
        return None, None
    return cached > 0, cached


def _cached_count(usage: Mapping[str, Any]) -> int | None:
    """Prompt tokens served from the cache: OpenAI ``*_tokens_details.cached_tokens`` (or its alias
    ``cached_input_tokens``), else Anthropic ``cache_read_input_tokens``, else a top-level
    ``cached_input_tokens``."""
    cached = _usage_detail_token(usage, _CACHED_DETAIL_GROUPS, _CACHED_FIELDS)
    if cached is None:
        cached = _token_count(usage.get("cache_read_input_tokens"))
    return cached if cached is not None else _token_count(usage.get("cached_input_tokens"))


def _reasoning_count(usage: Mapping[str, Any]) -> int | None:
    """``*_tokens_details.reasoning_tokens`` (or ``reasoning_output_tokens``), else a top-level
    ``reasoning_output_tokens``."""
    reasoning = _usage_detail_token(usage, _REASONING_DETAIL_GROUPS, _REASONING_FIELDS)
    return reasoning if reasoning is not None else _token_count(usage.get("reasoning_output_tokens"))


def usage_counts(usage: dict[str, Any]) -> tuple[int | None, int | None, int | None, int | None]:
    """(tokens_in, tokens_out, tokens_reasoning, cached_tokens) of a usage object: the counts
    scans add up, as `extract_token_stats` reports them, without building its dict."""
    get = usage.get
    tokens_out = _token_count(get("completion_tokens"))
    if tokens_out is None:
        tokens_out = _token_count(get("output_tokens"))
    return _prompt_size(usage), tokens_out, _reasoning_count(usage), _cached_count(usage)


def extract_token_stats(usage: Any) -> dict[str, Any]:
    """Normalize token totals across Responses, Chat Completions, and Anthropic Messages usage.

    ``tokens_in`` is the whole prompt size (see `_prompt_size`); cache creation is also reported
    separately as ``cache_creation_tokens``. A count the provider did not report stays None, never 0.
    """
    if type(usage) is not dict:
        usage = dict(usage) if isinstance(usage, Mapping) else {}
    if not usage:
        return dict(_NOTHING_REPORTED)
    tokens_in, tokens_out, tokens_reasoning, cached_tokens = usage_counts(usage)
    tokens_total = _token_count(usage.get("total_tokens"))
    if tokens_total is None and tokens_in is not None and tokens_out is not None:
        tokens_total = tokens_in + tokens_out
    return {
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "tokens_total": tokens_total,
        "tokens_reasoning": tokens_reasoning,
        "cached_tokens": cached_tokens,
        "cache_hit": None if cached_tokens is None else cached_tokens > 0,
        "cache_creation_tokens": _token_count(usage.get("cache_creation_input_tokens")),
    }


_NOTHING_REPORTED = {key: None for key in ("tokens_in", "tokens_out", "tokens_total", "tokens_reasoning",
                                           "cached_tokens", "cache_hit", "cache_creation_tokens")}


def arrays_counts(response: dict[str, Any]) -> tuple[Optional[int], Optional[int]]:
    """Prompt and generated tokens counted from a reply's token arrays (vLLM's ``prompt_token_ids``
    and each choice's ``token_ids``, as the token capture mode records them), None where absent."""
    prompt = response.get("prompt_token_ids")
    counted_in = len(prompt) if type(prompt) is list else None
    choices = response.get("choices")
    counted_out = None
    if type(choices) is list and choices:
        lengths = [len(ids) for choice in choices if type(choice) is dict and type(ids := choice.get("token_ids")) is list]
        counted_out = sum(lengths) if len(lengths) == len(choices) else None
    return counted_in, counted_out


def entry_counts(entry: Optional[dict[str, Any]]) -> Optional[tuple[int, int]]:
    """(prompt, generated) tokens a training-token entry gives (the prompt is its ``cum_len`` less
    its generated ids), or None when it gives none."""
    generated = entry.get("generation_token_ids") if entry is not None else None
    total = entry.get("cum_len") if entry is not None else None
    if type(generated) is not list or type(total) is not int or total < len(generated):
        return None
    return total - len(generated), len(generated)
