"""``python -m records DIR [ROLLOUT_ID ...]``: one JSON summary line per rollout in a capture dir.

For collector jobs and quick checks; needs only this package (pydantic, orjson).
"""

from __future__ import annotations

import sys

import orjson

from ._collect import read_model_call_records
from ._record import aggregate_model_call_records
from ._store import CaptureStore


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[0].strip("`"), file=sys.stderr)
        return 2 if not argv else 0
    store = CaptureStore(argv[0])
    for rollout_id in argv[1:] or store.rollout_ids():
        result = store.read_available(rollout_id)
        summary = aggregate_model_call_records(read_model_call_records(store, rollout_id), percentiles=(50, 99))
        summary = {"rollout_id": rollout_id, **summary, "unreadable_lines": result.malformed,
                   "incomplete": store.is_incomplete(rollout_id)}
        sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
