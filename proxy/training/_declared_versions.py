"""Weight versions declared by the trainer (issue 32; `records.contract` for the line's fields).

``POST /-/weight-version`` with ``{"version": "<label>"}`` says which policy weights the trainer has
just loaded into the model server; ``GET`` reads it back. From then on every captured call starts
under that version. A call in flight when the version changes is split where the update fell:
the sidecar counts, at that moment, the generated ids each of its streams has relayed
(`StreamTap.generated_so_far`, vLLM's ``token_ids``), and the call's span of the old version ends
there. A reply that cannot be counted mid-way (not streamed, or a stream without token ids) keeps
the version it started under and is marked ``weight_versions_unplaced``.

With ``--workers N`` the worker that takes the POST writes the declaration to the workers' shared
directory and signals its supervisor (SIGUSR1), which signals every worker to read it: all of
them switch within milliseconds, each placing the split in its own streams.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import TYPE_CHECKING, Any, Optional

import orjson

if TYPE_CHECKING:
    from ..call import CallExchange

log = logging.getLogger("mcc.proxy")

#: The shared file of a declaration, in the workers' shared directory.
DECLARATION_FILE = "weight-version.json"
#: The longest label taken (a label is a name, not a payload).
MAX_LABEL = 256


class WeightWatch:
    """One call's view of the declared versions: the one it started under and each change since,
    with where its streams stood (per choice index; None where it could not be counted)."""

    __slots__ = ("board", "start_version", "changes", "_exchange")

    def __init__(self, board: "DeclaredWeightVersions", version: str, exchange: "CallExchange") -> None:
        self.board = board
        self.start_version = version
        self.changes: list[tuple[str, Optional[dict[int, int]]]] = []
        self._exchange = exchange

    def changed(self, version: str) -> None:
        self.changes.append((version, self._exchange.generated_so_far()))

    def stop(self) -> None:
        self.board.watches.discard(self)

    def line_fields(self, choice_indexes: list[int]) -> dict[str, Any]:
        """``weight_versions`` (per choice, the last span open-ended), ``weight_version_source``,
        and ``weight_versions_unplaced`` when a change could not be placed."""
        unplaced = False
        per_choice = []
        for index in choice_indexes:
            spans: list[dict[str, Any]] = [{"version": self.start_version, "start": 0, "end": None}]
            for version, counts in self.changes:
                at = counts.get(index, 0) if counts is not None else None
                if at is None:
                    unplaced = True
                    continue
                last = spans[-1]
                if at <= last["start"]:
                    last["version"] = version  # Nothing of this choice passed under the version it replaces.
                else:
                    last["end"] = at
                    spans.append({"version": version, "start": at, "end": None})
            per_choice.append(spans)
        fields: dict[str, Any] = {"weight_versions": per_choice, "weight_version_source": "declared"}
        if unplaced:
            fields["weight_versions_unplaced"] = True
        return fields


class DeclaredWeightVersions:
    """The version the trainer last declared, and the calls in flight that watch it."""

    def __init__(self, shared_dir: Optional[str] = None) -> None:
        self.version: Optional[str] = None
        self.declared_at: Optional[float] = None
        self.watches: set[WeightWatch] = set()
        self._shared_dir = shared_dir

    def watch(self, exchange: "CallExchange") -> Optional[WeightWatch]:
        """A call goes upstream: its watch (``exchange.generated_so_far`` places a change), or
        None while no version has been declared."""
        if self.version is None:
            return None
        watch = WeightWatch(self, self.version, exchange)
        self.watches.add(watch)
        return watch

    def declare(self, version: str, declared_at: Optional[float] = None, share: bool = True) -> None:
        if version == self.version:
            return
        self.version, self.declared_at = version, declared_at if declared_at is not None else time.time()
        for watch in list(self.watches):
            watch.changed(version)
        log.info("weight version %s declared", version, extra={"weight_version": version})
        if share and self._shared_dir is not None:
            self._share()

    def reread(self) -> None:
        """Another worker declared (SIGUSR1 from the supervisor): take the shared declaration."""
        if self._shared_dir is None:
            return
        try:
            with open(os.path.join(self._shared_dir, DECLARATION_FILE), "rb") as handle:
                shared = orjson.loads(handle.read())
        except (OSError, orjson.JSONDecodeError):
            return
        if isinstance(shared, dict) and isinstance(shared.get("version"), str):
            self.declare(shared["version"], shared.get("declared_at"), share=False)

    def state(self) -> dict[str, Any]:
        return {"version": self.version, "declared_at": self.declared_at}

    def _share(self) -> None:
        assert self._shared_dir is not None
        path = os.path.join(self._shared_dir, DECLARATION_FILE)
        try:
            with open(path + f".{os.getpid()}.tmp", "wb") as handle:
                handle.write(orjson.dumps(self.state()))
            os.replace(path + f".{os.getpid()}.tmp", path)
            os.kill(os.getppid(), signal.SIGUSR1)
        except OSError as exc:
            log.warning("the weight version could not be shared with the other workers: %s", exc)


def declared_version(body: bytes) -> tuple[Optional[str], str]:
    """The label of a ``POST /-/weight-version`` body, or (None, what is wrong with it)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, 'the body must be JSON: {"version": "<label>"}'
    version = parsed.get("version") if isinstance(parsed, dict) else None
    if not isinstance(version, str) or not version.strip():
        return None, 'the body must be {"version": "<label>"} with a non-empty string label'
    if len(version) > MAX_LABEL:
        return None, f"the label is longer than {MAX_LABEL} characters"
    return version, ""
