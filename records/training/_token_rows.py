"""A training-token record as a dataset row (``kind="tokens"``): its columns and the row itself.

Apart from `_datasets` so that the numpy read path (`_token_arrays`) and the listing share it
without importing each other.
"""

from __future__ import annotations

from typing import Any

from ..contract import TokenRecord

#: The columns of ``kind="tokens"``: `TokenRecord`'s fields (``missing`` as a list), then
#: ``usable`` and ``unusable_reason`` as `TokenRecord` computes them.
TOKEN_COLUMNS: tuple[tuple[str, str], ...] = (
    ("rollout_id", "string"), ("model_call_id", "string"), ("call_index", "int64"), ("choice_index", "int64"),
    ("model", "string"), ("prompt_token_ids", "list<int64>"), ("generation_token_ids", "list<int64>"),
    ("generation_log_probs", "list<float64>"), ("finish_reason", "string"), ("error_category", "string"),
    ("source", "string"), ("missing", "list<string>"), ("problem", "string"), ("extends", "int64"),
    ("drift_at", "int64"), ("drift_from", "int64"), ("link", "string"), ("link_reason", "string"), ("usable", "bool"),
    ("unusable_reason", "string"),
) + (
    # Issue 32: prefix supply's proof, the aborted call resumed, and the weight versions that
    # sampled the generation (per token; the labels in order, to filter stale samples:
    # ``ds.filter(lambda row: set(row["weight_version_labels"]) <= fresh)``).
    ("prefix_supplied", "bool"), ("resumes", "string"), ("weight_version_source", "string"),
    ("weight_version_labels", "list<string>"), ("token_weight_versions", "list<string>"),
    ("spans_weight_update", "bool"),
)


def token_row(record: TokenRecord) -> dict[str, Any]:
    """A `TokenRecord` as a row of ``kind="tokens"``."""
    row = {name: getattr(record, name) for name, _ in TOKEN_COLUMNS if name not in ("usable", "unusable_reason")}
    row["missing"] = list(record.missing)
    row["weight_version_labels"] = list(row["weight_version_labels"])
    reason = record.unusable_reason
    row["usable"], row["unusable_reason"] = reason is None, reason
    return row
