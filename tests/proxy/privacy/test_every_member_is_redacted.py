"""Every member a capture line can hold goes through the rules (issue 73, point 1): not only the
request and the reply, but the ids copied from the agent's headers, a failure's text, and any
member added later. The members are generated from the readers' model (`records.ModelCallRecord`)
and the sidecar's own line members, so a new one cannot be forgotten: a secret planted in each is
gone after the rules and under metrics-only, except in the members the sidecar writes from what it
alone knows (`capture.SIDECAR_FIELDS`), which never hold an agent's or an upstream's text."""

from __future__ import annotations

import typing

import orjson
import pytest

from capture import CONTENT_FIELDS, SIDECAR_FIELDS, Redactor, RolloutPlaceholders, load_rules, metrics_only
from records import ModelCallRecord

SECRET = "sk-PLANTEDx0123456789abcdefXYZ"
RULES = load_rules({"rules": [{"name": "api_key", "pattern": r"sk-[A-Za-z0-9]{20,}"}]})


def _members() -> set[str]:
    """Every member a line can hold: the readers' model's fields (a line member read under its own
    name), and the line's own names of the members the model reads under others (docs/files.md)."""
    return set(ModelCallRecord.model_fields) | {"failure", "latency_ms", "request_raw", "response_raw"}


def _planted(member: str) -> dict:
    """A line with the secret in ``member``, as a text and inside an object (a failure's shape)."""
    return {"model_call_id": "0" * 32, "dialect": "chat", "request": {"messages": []}, "response": None,
            member: SECRET if member not in ("failure",) else {"stage": "upstream", "message": SECRET}}


@pytest.mark.parametrize("member", sorted(_members() - SIDECAR_FIELDS - set(CONTENT_FIELDS)))
def test_a_secret_in_any_member_is_gone_after_the_rules_and_under_metrics_only(member):
    ruled = _planted(member)
    counts = Redactor(RULES).redact_line(ruled, RolloutPlaceholders(b"k" * 32, "r"))
    assert SECRET.encode() not in orjson.dumps(ruled) and counts == {"api_key": 1}, ruled[member]
    bare = _planted(member)
    metrics_only(bare)
    assert SECRET.encode() not in orjson.dumps(bare), bare[member]


def test_the_headers_ids_and_a_failures_text_are_walked_and_its_facts_kept():
    walked = _members() - SIDECAR_FIELDS
    assert {"client_session_id", "client_assistant_message_id", "client_agent_id", "client_parent_agent_id"} <= walked
    line = {"model_call_id": "0" * 32, "failure": {"stage": "upstream", "category": "upstream_error",
                                                   "exception_type": "ValueError", "message": f"said {SECRET}"}}
    metrics_only(line)
    assert line["failure"] == {"stage": "upstream", "category": "upstream_error", "exception_type": "ValueError",
                               "message": "[REDACTED]"}


def test_the_sidecars_own_members_hold_no_free_text():
    """Each member never walked is the sidecar's: ids, clocks, counts, verdicts in its own words.
    Those the readers' model types as free text are reviewed here by name (a new one fails)."""
    texts = {name for name, field in ModelCallRecord.model_fields.items()
             if name in SIDECAR_FIELDS and str in typing.get_args(field.annotation) + (field.annotation,)}
    assert texts <= {"model_call_id", "dialect", "local_response_reason", "side_call", "weight_version_source",
                     "error_category", "retry_of", "prefix_not_supplied"}, texts
