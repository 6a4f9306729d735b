"""What a call's record says of issue 32's lineage, in words (`mcc show --call` and the report)."""

from __future__ import annotations

from records import TokenRecord


def lineage_words(record: TokenRecord) -> list[str]:
    """Issue 32, in words: prefix supply's proof, the aborted call resumed, the weight versions."""
    said = []
    if record.prefix_supplied is True:
        said.append("sent on its parent's exact ids (--supply-prefix), proved by the prompt ids the upstream reported")
    elif record.prefix_supplied is False:
        said.append("sent on its parent's exact ids (--supply-prefix), but the upstream's prompt ids do not begin with "
                    "them: not proved, treat as drift")
    if record.resumes is not None:
        said.append(f"resumes the aborted call {record.resumes}: its prompt is that call's prompt + partial generation")
    if record.weight_versions:
        spans = ", ".join(f"{span['version']} [{span['start']}, {'end' if span['end'] is None else span['end']})"
                          for span in record.weight_versions)
        said.append(f"weight versions ({record.weight_version_source}): {spans}"
                    + ("; spans a weight update" if record.spans_weight_update else ""))
    return said
