"""python -m records [--allow-empty] CAPTURES [ROLLOUT_ID ...]: one JSON summary line per rollout.

CAPTURES is a capture dir or a capture store's URL. For collector jobs and quick checks; needs
only this package (pydantic, orjson). Exits 1 with one sentence when the directory does not
exist, 2 when a store URL points nowhere (no manifest, no writer ever seen) or nothing is
uploaded there yet (--allow-empty reads either as an empty run), and says so on stderr when
it holds no capture files, so a job with a wrong mount or URL fails instead of succeeding silently.
"""

from __future__ import annotations

import os
import sys

import orjson

from .store import read_model_call_records
from .contract.reading import StoreNotFound
from .store import aggregate_model_call_records
from .store import CaptureStore

USAGE = "usage: python -m records [--allow-empty] CAPTURES [ROLLOUT_ID ...]"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + __doc__.split("\n\n", 1)[1].strip(), file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    allow_empty = argv[0] == "--allow-empty"
    if allow_empty:
        argv = argv[1:]
        if not argv:
            print(USAGE, file=sys.stderr)
            return 2
    try:
        store = CaptureStore(argv[0], allow_empty=allow_empty)
    except StoreNotFound as exc:  # A store URL that points nowhere: an error, as a missing directory is.
        print(f"records: {exc}", file=sys.stderr)
        return 2
    try:
        rollout_ids = argv[1:] or store.rollout_ids()
    except FileNotFoundError as exc:
        print(f"records: {exc}", file=sys.stderr)
        return 1
    if not rollout_ids:
        print(f"records: no capture files in {argv[0]}", file=sys.stderr)
    try:
        for rollout_id in rollout_ids:
            result = store.read_available(rollout_id)
            summary = aggregate_model_call_records(read_model_call_records(store, rollout_id), percentiles=(50, 99), extended=True)
            summary = {"rollout_id": rollout_id, **summary, "unreadable_lines": result.malformed,
                       "incomplete": store.is_incomplete(rollout_id)}
            sys.stdout.write(orjson.dumps(summary).decode() + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `python -m records DIR | head`: the reader has what it wanted.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
