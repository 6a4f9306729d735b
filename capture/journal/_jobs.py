"""A line whose building writes other files: a job, run where the line is appended (docs/files.md).

The token capture mode writes a call's training-token entries before its line, and one barrier
makes both durable (docs/tokens.md). That work is Python per call (an entry's arrays encoded, its
digest, Gym's locked append): run in the sidecar, it takes the interpreter lock from the event
loop that relays every other call's bytes (issue 76). So the line's builder sends a `Job`
instead: the name of a function and its arguments, which the capture process calls beside the
lines it appends, outside the sidecar's interpreter. Where there is no capture process, a writer
thread calls the same function with the same arguments: one way of building, two places.

The function returns a `JobLine`: the line, the other files it wrote (the line's barrier makes
them durable too), what to do when that barrier fails for them, and what the sidecar is told once
the barrier has run (``reply()``, pickled back: the sidecar's own counters, logs and memory are
its to change, not the process's). The sidecar runs the job's ``on_reply`` with it on the event
loop before the line settles: before the agent sees the end of the reply.

The journal knows no feature: a job names its function as ``"module:function"``, imported by the
process on first use.
"""

from __future__ import annotations

import importlib
import io
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Optional

import orjson


@dataclass
class JobLine:
    """What a job made."""

    line: bytes
    #: Other files the job wrote, made durable by the line's barrier.
    also: list[str]
    #: Told the error when the barrier could not make ``also`` durable (the line then fails too).
    not_durable: Callable[[BaseException], None]
    #: What the sidecar is told, once the line's barrier has run (or failed): picklable.
    reply: Callable[[], Any]


class Job:
    """A line built where it is appended: ``target`` (``"module:function"``) called with ``args``
    (picklable) returns its `JobLine`; ``on_reply(value)`` runs on the sidecar's event loop with
    the value of its ``reply()`` (None when the job itself failed), before the line settles."""

    __slots__ = ("target", "args", "on_reply")

    def __init__(self, target: str, args: tuple[Any, ...], on_reply: Callable[[Any], None]) -> None:
        self.target = target
        self.args = args
        self.on_reply = on_reply

    def run_here(self) -> JobLine:
        """The job run in this process (a writer thread's way)."""
        return _function(self.target)(*self.args)

    def pickled(self) -> bytes:
        """The job as the capture process is sent it (a stream's ``orjson.Fragment`` lists as their text)."""
        buffer = io.BytesIO()
        FragmentPickler(buffer, pickle.HIGHEST_PROTOCOL).dump((self.target, self.args))
        return buffer.getvalue()


class FragmentPickler(pickle.Pickler):
    """A stream's per-token lists are `orjson.Fragment`s (JSON text kept as it came,
    `capture.StreamTap`'s ``compact_arrays``), which pickle cannot take as they are: each goes as
    its text, and comes back a fragment."""

    dispatch_table = {orjson.Fragment: lambda fragment: (orjson.Fragment, (orjson.dumps(fragment),))}


def run_pickled_job(payload: bytes) -> JobLine:
    """A job the sidecar sent, run (in the capture process, or on a writer thread once it died).
    Only the sidecar that started the process writes to its socket pair: its pickles are its own."""
    target, args = pickle.loads(payload)
    return _function(target)(*args)


def reply_of(made: Optional[JobLine]) -> bytes:
    """A job's reply as it goes back: pickled; empty when there is none or it cannot be made."""
    if made is None:
        return b""
    try:
        return pickle.dumps(made.reply(), pickle.HIGHEST_PROTOCOL)
    except Exception:  # The reply is the sidecar's bookkeeping: the line is written either way.
        return b""


def unpickle_reply(reply: bytes) -> Any:
    return pickle.loads(reply) if reply else None


_FUNCTIONS: dict[str, Callable[..., JobLine]] = {}


def _function(target: str) -> Callable[..., JobLine]:
    found = _FUNCTIONS.get(target)
    if found is None:
        module, _, name = target.partition(":")
        found = _FUNCTIONS[target] = getattr(importlib.import_module(module), name)
    return found
