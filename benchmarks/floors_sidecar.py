"""A sidecar with one part of capture taken out, for `bench_floors.py`'s decomposition only.

    python benchmarks/floors_sidecar.py <part> serve --upstream ... --capture-dir ...

``<part>``: ``none`` (the sidecar as shipped), ``threads`` (every line appended on the sidecar's
own writer threads, `capture.journal.GroupCommitter`, as before the capture process of issue 34 and as
in the token capture mode still), ``barrier`` (on those threads, lines built and appended but no
fsync or syncfs run: what the durability barrier costs), ``persistence`` (no line is built or
written; every call is settled at once: what the relay's own capture bookkeeping costs, the tap,
the exchange, the held reply). Each is the shipped code with one method replaced in this process:
never a mode of the product (a call would be acknowledged before its line is durable).
"""

from __future__ import annotations

import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import capture.journal._group_commit as group_commit  # noqa: E402
import capture.journal._writer as capture_writer  # noqa: E402

PARTS = ("none", "threads", "barrier", "persistence")


def _take_out(part: str) -> None:
    if part in ("threads", "barrier"):
        writer_init = capture_writer.Journal.__init__

        def on_threads(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            writer_init(self, *args, **{**kwargs, "process": False})
        capture_writer.Journal.__init__ = on_threads  # type: ignore[method-assign]
    if part == "barrier":
        group_commit.GroupCommitter._barrier = lambda self, pending: None  # type: ignore[method-assign]
    elif part == "persistence":
        def settle_at_once(self, rollout_id, build, size, settled):  # type: ignore[no-untyped-def]
            self._loop.call_soon(settled, True)
        capture_writer.Journal.submit = settle_at_once  # type: ignore[method-assign]
    elif part not in ("none", "threads"):
        raise SystemExit(f"the part is one of {PARTS}, not {part!r}")


if __name__ == "__main__":
    _take_out(sys.argv[1])
    sys.argv = ["proxy", *sys.argv[2:]]
    runpy.run_module("proxy", run_name="__main__")
