"""Calls in flight, as each sidecar publishes them: the live hand-off's write barrier (docs/reading.md,
"One write barrier"; DESIGN section 15).

A consumer hands out an ended rollout only when no call of it is in flight on any sidecar, whichever
way the end came (``POST /-/rollouts/<id>/end`` or `records.end_rollout`). Each sidecar process
that captures publishes, every `PUBLISH_SECONDS`, ``inflight/<instance>.json`` in its capture
directory: ``at`` (when it looked) and ``rollouts`` (each rollout with a captured call under way
then: ``{"calls": n, "since": t}``). A call is counted from before it is forwarded until its line
is durable, so a publication made after a rollout's end that does not name it says that every call
made before the end has its line on disk.

The publication is replaced whole (a write, then a rename) and never fsynced: it describes a live
process. A sidecar that died leaves its last one; older than `SILENT_SECONDS`, it is a dead
sidecar's, and a rollout it names was cut mid-call (its agent never saw the reply's end).
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import orjson

IN_FLIGHT_DIR = "inflight"
#: How often a sidecar publishes its calls in flight (a take waits about this long after an end).
PUBLISH_SECONDS = 0.1
#: A publication not replaced for this long is a dead (or wedged) sidecar's.
SILENT_SECONDS = 10.0
#: How long a call in flight holds its ended rollout back before it is handed out incomplete:
#: `records.Consumer`'s ``in_flight_bound_seconds`` default (the sidecar's own end waits 30 s).
IN_FLIGHT_BOUND_SECONDS = 60.0


#: A live sidecar publishes within `PUBLISH_SECONDS`; one that has not looked again this long after an
#: end is taken at its last word (the window it leaves: a call begun in the 0.1 s before the end).
_LATE_SECONDS = 2.0


def publication_path(directory: str, instance: str) -> str:
    return os.path.join(directory, IN_FLIGHT_DIR, f"{instance}.json")


def publish_in_flight(directory: str, instance: str, at: float, rollouts: dict[str, dict[str, Any]]) -> None:
    """Replace this sidecar process's publication (its calls in flight as of ``at``)."""
    path = publication_path(directory, instance)
    temporary = path + ".tmp"
    data = orjson.dumps({"instance": instance, "at": at, "pid": os.getpid(), "rollouts": rollouts})
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    except FileNotFoundError:  # Its directory first (never the capture directory: a removed one stays a fault).
        try:
            os.mkdir(os.path.dirname(path))  # (modes: the sidecar's umask, --capture-permissions)
        except FileExistsError:
            pass
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def sweep_dead_publications(directory: str, older_than: float = 600.0) -> None:
    """Remove the publications of sidecars dead for ``older_than`` seconds (a SIGKILL leaves its last)."""
    folder = os.path.join(directory, IN_FLIGHT_DIR)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    cutoff = time.time() - older_than
    for name in names:
        try:
            if os.stat(os.path.join(folder, name)).st_mtime < cutoff:
                os.unlink(os.path.join(folder, name))
        except FileNotFoundError:
            pass


def withdraw_in_flight(directory: str, instance: str) -> None:
    """A sidecar that drained and stopped: nothing of it is in flight."""
    try:
        os.unlink(publication_path(directory, instance))
    except FileNotFoundError:
        pass


def read_in_flight(directory: str) -> list[dict[str, Any]]:
    """Every sidecar's publication in ``directory`` (unreadable ones left out: being replaced)."""
    found: list[dict[str, Any]] = []
    try:
        names = os.listdir(os.path.join(directory, IN_FLIGHT_DIR))
    except FileNotFoundError:
        return found
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(directory, IN_FLIGHT_DIR, name), "rb") as handle:
                record = orjson.loads(handle.read())
        except (FileNotFoundError, orjson.JSONDecodeError):
            continue
        if isinstance(record, dict) and isinstance(record.get("at"), (int, float)) \
                and isinstance(record.get("rollouts"), dict):
            found.append(record)
    return found


def calls_in_flight(publications: list[dict[str, Any]], rollout_id: str, now: float) -> int:
    """How many calls of the rollout live sidecars have in flight (0: none)."""
    return sum(int(record["rollouts"][rollout_id].get("calls", 1)) for record in publications
               if rollout_id in record["rollouts"] and now - record["at"] < SILENT_SECONDS)


def in_flight_readiness(publications: list[dict[str, Any]], rollout_id: str, ended_at: float, now: float,
                        bound: float) -> tuple[str, Optional[str]]:
    """Whether an ended rollout may be handed out, and why not: ``ready``; ``wait`` (a call of it
    is in flight on a live sidecar, or a live sidecar has not looked since its end: it publishes
    within `PUBLISH_SECONDS`); ``incomplete`` once ``bound`` seconds passed since the end with a
    call still in flight on a live sidecar (it never finished), with what names it. A sidecar
    silent for `SILENT_SECONDS` is dead and not waited for: a call it had in flight was cut, never
    acknowledged to its agent (a line is durable before its agent sees the reply's end)."""
    verdict: tuple[str, Optional[str]] = ("ready", None)
    for record in publications:
        at = record["at"]
        if now - at >= SILENT_SECONDS:
            continue  # A dead sidecar: the calls it had in flight died with it (their agents saw them fail).
        named = record["rollouts"].get(rollout_id)
        if named is None and (at > ended_at or now - ended_at > _LATE_SECONDS):
            # Looked after the end and has nothing of it; or not looked again within `_LATE_SECONDS`
            # of the end (a loop blocked that long finishes no call either): taken at its last word.
            continue
        if now - ended_at < bound:
            return "wait", None
        if named is not None:
            verdict = ("incomplete", f"{named.get('calls', 1)} call(s) in flight on sidecar {record.get('instance')} "
                                     f"since {named.get('since')}, still {bound:.0f} s after the end")
    return verdict


__all__ = [
    "IN_FLIGHT_BOUND_SECONDS", "IN_FLIGHT_DIR", "PUBLISH_SECONDS", "SILENT_SECONDS", "calls_in_flight",
    "in_flight_readiness", "publication_path", "publish_in_flight", "read_in_flight", "sweep_dead_publications",
    "withdraw_in_flight",
]
