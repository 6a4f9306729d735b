"""The rollout-id rule of the file contract (docs/files.md).

A rollout id becomes a file name, so it is validated, never sanitised: anything that does not
match the pattern is refused before any file is touched.
"""

from __future__ import annotations

import re

from ._errors import InvalidRolloutId

#: docs/files.md. The first character may not be '.', so '.' and '..' can never be ids; no '/' at all.
ROLLOUT_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def is_valid_rollout_id(rollout_id: object) -> bool:
    """Return True when ``rollout_id`` is a str that matches the rule exactly."""
    return isinstance(rollout_id, str) and ROLLOUT_ID_PATTERN.fullmatch(rollout_id) is not None


def validate_rollout_id(rollout_id: object) -> str:
    """Return ``rollout_id`` unchanged, or raise `InvalidRolloutId` saying why it is refused."""
    if is_valid_rollout_id(rollout_id):
        return rollout_id  # type: ignore[return-value]  # is_valid_rollout_id checked it is a str
    shown = repr(rollout_id)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise InvalidRolloutId(  # Worded as NeMo Gym's, so callers matching its text still match.
        f"Invalid rollout id: {shown}: expected 1-200 characters of [A-Za-z0-9._-] "
        "starting with a letter or digit"
    )
