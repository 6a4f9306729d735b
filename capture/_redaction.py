"""Redaction of what a capture line keeps (docs/privacy.md), sans-io: rules, a hook, and the walk
that applies them to every text value of a line before anything is written.

A rule is a name and a regular expression; a match is replaced by ``[REDACTED:<name>:<tag>]``, the
same value by the same placeholder within a rollout (the tag is a keyed digest of the value and
the rollout: `RolloutPlaceholders`), so a conversation stays readable. A hook is a callable
``function(text) -> text`` given every text value after the rules. Each text is redacted whole, as rebuilt: a secret a stream
split across chunks is one string by then.

What cannot be redacted as text is not kept: a logprob entry's token text (a secret spans
several tokens, so no token holds it whole) is blanked, and the raw stream text is dropped.
The metrics-only form (`metrics_only`) keeps no content value at all.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional

import orjson

#: What stands in a metrics-only line for every content value.
CONTENT_REMOVED = "[REDACTED]"
#: Keys whose string values say what happened, not what was said: kept in a metrics-only line.
_FACT_KEYS = frozenset({
    "id", "model", "object", "role", "type", "finish_reason", "stop_reason", "status", "dialect", "model_call_id",
    "response_id", "previous_response_id", "call_id", "tool_call_id", "item_id", "name", "service_tier",
    "system_fingerprint", "error_category", "reason", "code", "weight_version", "version", "request_id",
    "stop_sequence", "tool_choice", "response_source", "local_response_reason", "engine", "engine_version",
    "weight_version_source", "output_mode",
})
#: Line members that hold content: walked (rules) or emptied (metrics-only).
CONTENT_FIELDS = ("request", "response", "request_raw", "response_raw")
#: Line members the sidecar writes from what it alone knows (its ids, clocks, counts, verdicts, the
#: operator's model name): never walked. Every other member -- the ids copied from the agent's
#: headers (``client_session_id``, ...), a failure's text, and any member added later -- is walked
#: by the rules and the hook, and emptied under metrics-only, as content is (issue 73: a header's id
#: escaped the rules while they covered only the content members).
SIDECAR_FIELDS = frozenset({
    "model_call_id", "dialect", "model_ref", "started_at", "completed_at", "latency_ms", "latency_ttft_ms",
    "status_code", "upstream_status_code", "upstream_attempted", "response_source", "local_response_reason",
    "error_category", "stream_truncated", "added_request_fields", "retry_of", "token_entries", "prefix_supplied",
    "prefix_not_supplied", "weight_versions", "weight_version_source", "weight_versions_unplaced", "resumes",
    "side_call", "websocket", "privacy", "redactions", "redaction_failed", "response_raw_dropped",
    "request_body_refused", "routed_experts", "capture_failed",
})


class RedactionConfigError(ValueError):
    """A rules file that cannot be used: said in one sentence, before the sidecar serves."""


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: "re.Pattern[str]"


def load_rules(document: Any, where: str = "the rules") -> tuple[Rule, ...]:
    """The rules of a parsed YAML document ``{"rules": [{"name": ..., "pattern": ...}, ...]}``;
    `RedactionConfigError` for anything else (a pattern that does not compile included)."""
    rules = document.get("rules") if isinstance(document, dict) else None
    if not isinstance(rules, list) or not rules:
        raise RedactionConfigError(f"{where}: expected 'rules:' with a list of {{name, pattern}}")
    if "redact_key" in document:  # One place for the key, beside the other secrets (docs/privacy.md).
        raise RedactionConfigError(f"{where}: redact_key does not belong in the rules file (it would be read by "
                                   "whoever reads the rules): set MCC_REDACT_KEY, or redact_key in the sidecar's "
                                   "YAML configuration")
    unknown = sorted(str(key) for key in document if key != "rules")
    if unknown:
        raise RedactionConfigError(f"{where}: unknown key(s) {', '.join(unknown)}: the rules file holds 'rules:' only")
    loaded, names = [], set()
    for position, rule in enumerate(rules):
        if not isinstance(rule, dict) or not isinstance(rule.get("name"), str) or not isinstance(rule.get("pattern"), str):
            raise RedactionConfigError(f"{where}: rule {position + 1} needs a name and a pattern, both strings")
        extra = sorted(str(key) for key in rule if key not in ("name", "pattern"))
        if extra:
            raise RedactionConfigError(f"{where}: rule {rule['name']!r} has unknown key(s) {', '.join(extra)}: a rule "
                                       "is a name and a pattern")
        name = rule["name"]
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name) or name in names:
            raise RedactionConfigError(f"{where}: rule name {name!r} must be 1-64 of [A-Za-z0-9_.-] and unique")
        try:
            pattern = re.compile(rule["pattern"])
        except re.error as exc:
            raise RedactionConfigError(f"{where}: rule {name!r} does not compile: {exc}") from None
        if pattern.match(""):
            raise RedactionConfigError(f"{where}: rule {name!r} matches the empty string")
        names.add(name)
        loaded.append(Rule(name, pattern))
    return tuple(loaded)


class RolloutPlaceholders:
    """One rollout's placeholders: the same value, the same ``[REDACTED:<rule>:<tag>]``, where the
    tag is the first 8 hex digits of HMAC-SHA256(key, rollout, rule, value). Nothing is kept: every
    process holding the key (a supervisor's workers, sidecars given one ``MCC_REDACT_KEY``) names
    a value alike, and no value is held in the clear; without the key a tag says nothing of it."""

    __slots__ = ("_key", "_rollout", "_keyed")

    def __init__(self, key: bytes, rollout_id: str) -> None:
        self._key = key
        self._rollout = rollout_id
        self._keyed: Optional["hmac.HMAC"] = None  # Keyed with the rollout at the first match, then copied.

    def placeholder(self, rule: str, value: str) -> str:
        if self._keyed is None:
            self._keyed = hmac.new(self._key, self._rollout.encode("utf-8", "surrogatepass") + b"\x00", hashlib.sha256)
        digest = self._keyed.copy()
        digest.update(rule.encode("utf-8", "surrogatepass") + b"\x00" + value.encode("utf-8", "surrogatepass"))
        return f"[REDACTED:{rule}:{digest.hexdigest()[:8]}]"


class Redactor:
    """Rules then a hook, over every text value of a line (`redact_line`)."""

    def __init__(self, rules: tuple[Rule, ...] = (), hook: Optional[Callable[[str], str]] = None) -> None:
        self.rules = rules
        self.hook = hook
        #: Every rule can be looked for in a line's texts joined by NUL (`_may_change`): none is
        #: anchored or looks around, so a match in one text is a match in the joined texts.
        self._joinable = all(_joinable(rule.pattern.pattern) for rule in rules)

    def redact_line(self, fields: dict[str, Any], placeholders: RolloutPlaceholders) -> dict[str, int]:
        """``fields`` redacted in place; the values each rule replaced. Raises what the hook raises."""
        counts: dict[str, int] = {}
        for key in CONTENT_FIELDS:
            if key == "response_raw" and fields.get(key) is not None:
                fields[key] = None  # A stream's text: a secret split across its chunks is in no one chunk.
                fields["response_raw_dropped"] = "redaction"
            elif key in fields and self._may_change(fields[key]):
                fields[key] = self._walk(fields[key], placeholders, counts)
        for key in [key for key in fields if key not in SIDECAR_FIELDS and key not in CONTENT_FIELDS]:
            value = fields[key]  # Copied from the agent's headers, or said by the upstream (most calls: none).
            if value is not None and self._may_change(value):
                fields[key] = self._walk(value, placeholders, counts)
        return counts

    def _may_change(self, value: Any) -> bool:
        """Whether the walk could change ``value``: a hook, a logprob entry or a stream's kept JSON
        (whose token texts are blanked), or a rule that matches its texts -- each rule looked for
        once over all of them, joined (most lines hold nothing to redact: no copy is made)."""
        if self.hook is not None or not self._joinable:
            return True
        texts: list[str] = []
        if _collect(value, texts):
            return True
        joined = "\x00".join(texts)
        return any(rule.pattern.search(joined) is not None for rule in self.rules)

    def _walk(self, value: Any, placeholders: RolloutPlaceholders, counts: dict[str, int]) -> Any:
        kind = type(value)
        if kind is orjson.Fragment:  # A stream's per-token lists, kept as JSON text (`capture.TokenArrays`).
            value = _parsed(value)
            kind = type(value)
            if kind is list:  # Fresh objects: blanked in place, without a copy of each entry.
                return [_blanked_in_place(item) if type(item) is dict and _is_logprob_entry(item)
                        else self._walk(item, placeholders, counts) for item in value]
        if kind is str:
            return self._text(value, placeholders, counts)
        if kind is dict:
            if _is_logprob_entry(value):
                return _blank_token_text(value)
            return {name: self._walk(item, placeholders, counts) for name, item in value.items()}
        if kind is list:
            return [self._walk(item, placeholders, counts) for item in value]
        return value

    def _text(self, text: str, placeholders: RolloutPlaceholders, counts: dict[str, int]) -> str:
        for rule in self.rules:
            if rule.pattern.search(text) is None:
                continue

            def replace(match: "re.Match[str]", name: str = rule.name) -> str:
                counts[name] = counts.get(name, 0) + 1
                return placeholders.placeholder(name, match.group(0))
            text = rule.pattern.sub(replace, text)
        if self.hook is not None:
            redacted = self.hook(text)
            if type(redacted) is not str:
                raise TypeError(f"the redaction hook returned {type(redacted).__name__}, not str")
            if redacted != text:
                counts["hook"] = counts.get("hook", 0) + 1
            text = redacted
        return text


def _joinable(pattern: str) -> bool:
    """No anchor and no lookaround (a ``[^...]`` class is neither): matches in a text are matches
    in texts joined by NUL, which is, like a text's ends, no word character."""
    plain = pattern.replace("[^", "[")
    return not any(mark in plain for mark in ("^", "$", "\\A", "\\Z", "(?<", "(?=", "(?!"))


def _collect(value: Any, texts: list[str]) -> bool:
    """``value``'s texts into ``texts``; True at once when it holds what the walk always changes."""
    kind = type(value)
    if kind is str:
        texts.append(value)
    elif kind is dict:
        if _is_logprob_entry(value):
            return True
        for item in value.values():
            if _collect(item, texts):
                return True
    elif kind is list:
        for item in value:
            if _collect(item, texts):
                return True
    elif kind is orjson.Fragment:
        return True
    return False


def metrics_only(fields: dict[str, Any], keep_token_ids: bool = False) -> None:
    """``fields`` in metrics-only form, in place: ids, timing, status, usage, cache counts, finish
    reasons, tool names and counts kept; every other text value of the request and response
    replaced by `CONTENT_REMOVED`; no raw text; token arrays and logprobs gone, unless
    ``keep_token_ids`` (``--privacy-keep-token-ids``: ids and logprob numbers, never token texts)."""
    for key in CONTENT_FIELDS:
        if key in ("request_raw", "response_raw"):
            if fields.get(key) is not None:
                fields[key] = None
        elif key in fields:
            fields[key] = _facts(fields[key], None, keep_token_ids)
    for key in [key for key in fields if key not in SIDECAR_FIELDS and key not in CONTENT_FIELDS]:
        value = fields[key]  # The agent's headers' ids, a failure's text: no text kept either.
        if key == "failure" and type(value) is dict:  # Its stage, category and type are the sidecar's words.
            fields[key] = {name: item if name in _FAILURE_FACTS or type(item) is not str else CONTENT_REMOVED
                           for name, item in value.items()}
        elif value is not None:
            fields[key] = _facts(value, None, keep_token_ids)


#: A failure's members that say what happened in the sidecar's own words (docs/files.md ``failure``).
_FAILURE_FACTS = frozenset({"stage", "category", "exception_type", "retryable"})


_ID_KEYS = frozenset({"prompt_token_ids", "token_ids", "generation_token_ids"})
_ARRAY_KEYS = frozenset({"generation_log_probs", "logprobs", "input_messages", "output_messages", "routed_experts",
                         "sglext", "top_logprobs", "tokens", *_ID_KEYS})


def _facts(value: Any, key: Optional[str], keep_token_ids: bool) -> Any:
    if type(value) is orjson.Fragment:
        value = _parsed(value)
    kind = type(value)
    if kind is str:
        return value if key in _FACT_KEYS else CONTENT_REMOVED
    if kind is dict:
        kept = {}
        for name, item in value.items():
            if name not in _ARRAY_KEYS:
                kept[name] = _facts(item, name, keep_token_ids)
            elif keep_token_ids and name in _ID_KEYS:
                kept[name] = item
            elif keep_token_ids and name in ("logprobs", "generation_log_probs"):
                kept[name] = _numbers_only(item)
            else:
                kept[name] = None
        return kept
    if kind is list:
        return [_facts(item, key, keep_token_ids) for item in value]
    return value  # Numbers, booleans, null: counts and flags.


def _parsed(fragment: Any) -> Any:
    return orjson.loads(orjson.dumps(fragment))


def _numbers_only(value: Any) -> Any:
    """Logprobs without any token text (`_blank_token_text` on each entry)."""
    if type(value) is orjson.Fragment:
        value = _parsed(value)
    if type(value) is dict:
        if _is_logprob_entry(value):
            return _blank_token_text(value)
        return {name: _numbers_only(item) for name, item in value.items()}
    if type(value) is list:
        return [_numbers_only(item) for item in value]
    return value if type(value) is not str else ""


def _is_logprob_entry(value: dict[str, Any]) -> bool:
    return "logprob" in value and "token" in value


def _blanked_in_place(entry: dict[str, Any]) -> dict[str, Any]:
    """`_blank_token_text` on an entry nothing else holds (parsed just now): changed in place."""
    token = entry.get("token")
    if type(token) is str and not token.startswith("token_id:"):
        entry["token"] = ""
        if "bytes" in entry:
            entry["bytes"] = None
    tops = entry.get("top_logprobs")
    if type(tops) is list and tops:
        for top in tops:
            if type(top) is dict:
                _blanked_in_place(top)
    return entry


def _blank_token_text(entry: dict[str, Any]) -> dict[str, Any]:
    """A logprob entry without its token's text (ids written as ``token_id:<n>`` stay); ``entry``
    itself unchanged (`_blanked_in_place` on a copy of it and of its alternatives)."""
    copy = dict(entry)
    if type(copy.get("top_logprobs")) is list:
        copy["top_logprobs"] = [dict(top) if type(top) is dict else top for top in copy["top_logprobs"]]
    return _blanked_in_place(copy)
