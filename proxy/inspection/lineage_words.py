"""What a call's record says of issue 32's lineage, in words (`mcc show --call` and the report)."""

from __future__ import annotations

from records import TokenRecord


#: The trajectory builder's reasons (`records.CallLink.reason`), in words.
_REASONS = {
    "parent_digest_mismatch": "its prompt does not begin with its parent's prompt + generation ids",
    "parent_unresolved": "the call it continues could not be told when it was sent",
    "parent_call_id_missing": "the call it continues has no entry",
    "parent_call_id_missing_recovered": "the call it continues has no entry; attached to the longest earlier prefix",
    "delta_chain_unreconstructable": "its delta prompt cannot be rebuilt through its parents",
    "duplicate_call_id_conflict": "two different entries have its call id",
    "no_generated_tokens": "it generated no tokens",
    "retry_not_kept": "a retry whose generation no later call continues",
}


def link_words(record: TokenRecord) -> str | None:
    """The trajectory builder's verdict on the call (`TokenRecord.link`), in words, when it is more
    than a root or a clean extension: what masks a rollout is said on every reader."""
    if record.link not in ("unlinked", "left_out"):
        return None
    why = _REASONS.get(record.link_reason or "", record.link_reason or "")
    if record.link == "unlinked":
        return f"unlinked ({record.link_reason}: {why}): records.trajectories masks this rollout"
    return f"left out of the trajectories ({record.link_reason}: {why})"


def lineage_words(record: TokenRecord) -> list[str]:
    """Issue 32, in words: prefix supply's proof, the aborted call resumed, the weight versions;
    and the builder's verdict when it leaves the call unlinked or out (`link_words`)."""
    said = []
    linked = link_words(record)
    if linked is not None:
        said.append(linked)
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
