"""A rollout's training-token entries read back, wherever the captures are (docs/tokens.md): Gym's
`read_token_entries`, the late entries, and clearing a rollout's token files before a run."""

from __future__ import annotations

import os
from typing import Any

import orjson

from ._paths import Where, directory_of
from ..contract import TokenFiles
from ..contract.reading import TOKENS_SUFFIX
from ._tokens import entry_counts


def read_token_entries(directory: Where, rollout_id: str) -> list[dict[str, Any]]:
    """A rollout's entries as written (prompts of resolved children may be deltas); ``directory``:
    the token files' (a path or a `CaptureStore`)."""
    return [entry for _, entry in TokenFiles(directory_of(directory, "read_token_entries")).entries(rollout_id)[0]]


def late_entries(directory: Where, rollout_id: str) -> list[dict[str, Any]]:
    """Entries that came after the rollout was frozen, kept as evidence."""
    try:
        with open(TokenFiles(directory_of(directory, "late_entries")).path(rollout_id, ".tokens.late.jsonl"), "rb") as handle:
            return [orjson.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        return []


def clear_token_captures(rollout_ids: list[str], token_dir: Where) -> None:
    """Before dispatch: the training-token files of exactly these ids go (`TokenFiles.delete`)."""
    if isinstance(rollout_ids, (str, bytes)):
        raise TypeError("rollout_ids must be a collection of rollout ids, not one string")
    files = TokenFiles(directory_of(token_dir, "clear_token_captures"))
    for rollout_id in rollout_ids:
        files.delete(rollout_id)


def counts_from_entries(capture_dir: str, rollout_id: str) -> dict[str, tuple[int, int]]:
    """(prompt, generated) tokens per call, from the rollout's training-token entries (the token
    capture mode's), for calls whose reply reported no usage; empty without a readable token file
    (what the entries are is for the token readers to say)."""
    if not os.path.exists(os.path.join(capture_dir, rollout_id + TOKENS_SUFFIX)):
        return {}
    try:
        entries = read_token_entries(capture_dir, rollout_id)
    except (OSError, ValueError):
        return {}
    counts = {}
    for entry in entries:
        counted = entry_counts(entry)
        if counted is not None:
            counts[entry["model_call_id"]] = counted
    return counts
