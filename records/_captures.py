"""`Captures`: "where the captures are", said once (docs/reading.md).

Every reader of `records` takes the same argument -- a capture directory, a `CaptureStore` or a
capture store's URL -- under one name or another. A `Captures` takes it once, checks it at once
(a wrong type or a directory that is not there fails here, in one sentence, not at the first
read), and answers every question about the run from there: its rollouts, their calls, token
records, trajectories and ends, and a consumer of the live hand-off.

A store URL stays a URL (a trainer may start before any sidecar uploaded: its consumer waits, and
only a read of calls says `StoreNotFound` while nothing is there); each question brings the store's view up to date with what the writers
have uploaded since (only the rollouts new manifests name are rebuilt), so a `Captures` opened at
the start of a run keeps seeing the run.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator, Optional, Union

from .contract import ObjectStore, RolloutEnd, RoutedExperts, TokenRecord
from .contract.reading import StoreNotFound, is_store_url
from .store import (
    CaptureStore,
    ModelCallRecord,
    aggregate_model_call_metrics,
    end_rollout,
    read_model_call_records,
    read_rollout_end,
    read_token_entries,
)
from .training import (
    CallSpan, Consumer, Trajectory, TrajectoryBuild, iter_token_records, read_routed_experts, read_token_records,
    trajectories,
)


class Captures:
    """A run's captures: a capture directory (``str`` or ``os.PathLike``), a `CaptureStore`, or a
    capture store's URL (``segments:///...``, ``s3://...``)."""

    def __init__(self, where: Union[str, "os.PathLike[str]", CaptureStore, "Captures"], *,
                 token_dir: Optional[Union[str, "os.PathLike[str]"]] = None) -> None:
        """``token_dir``: where the training-token files are, when not beside the capture files
        (the sidecar's ``--token-dir``)."""
        if isinstance(where, Captures):
            token_dir = token_dir if token_dir is not None else where.token_dir
            where = where.where
        if isinstance(where, str) and is_store_url(where):
            ObjectStore(where)  # A scheme without its filesystem (s3fs, ...) is refused here: StoreUnavailable.
            self.where: Union[str, CaptureStore] = where
        else:
            store = where if isinstance(where, CaptureStore) else CaptureStore(_path(where, "Captures"))
            if not os.path.isdir(store.capture_dir):
                raise StoreNotFound(f"Captures: no capture directory at {store.capture_dir}")
            self.where = store
        #: Where the training-token files are (None: beside the capture files).
        self.token_dir: Optional[str] = _path(token_dir, "Captures (token_dir)") if token_dir is not None else None

    def __repr__(self) -> str:
        where = self.where if isinstance(self.where, str) else self.where.capture_dir
        return f"Captures({where!r})"

    def __fspath__(self) -> str:
        """A `Captures` is a path-like of its directory (on a URL, the store's view as of now), so
        every reader of `records` takes one where it takes a directory."""
        return self.store.capture_dir

    @property
    def store(self) -> CaptureStore:
        """The captures as a `CaptureStore` (Gym's surface); on a URL, its view as of now."""
        return CaptureStore(self.where) if isinstance(self.where, str) else self.where

    def rollout_ids(self) -> list[str]:
        """Every rollout with a capture file, sorted."""
        return self.store.rollout_ids()

    def calls(self, rollout_id: str, *, strict: bool = False) -> list[ModelCallRecord]:
        """The rollout's calls as `ModelCallRecord`\\ s (`read_model_call_records`)."""
        return read_model_call_records(self.store, rollout_id, strict=strict)

    def metrics(self, rollout_id: str, percentiles: Iterable[float] = (), *, extended: bool = False) -> dict[str, Any]:
        """Gym's seven totals of the rollout (`aggregate_model_call_metrics`)."""
        return aggregate_model_call_metrics(self.store, rollout_id, percentiles, extended=extended)

    def tokens(self, rollout_id: str) -> list[TokenRecord]:
        """The rollout's `TokenRecord`\\ s (`read_token_records`)."""
        return read_token_records(self.store, rollout_id, self.token_dir)

    def iter_tokens(self, rollout_id: str) -> Iterator[TokenRecord]:
        """The rollout's `TokenRecord`\\ s one line at a time (`iter_token_records`)."""
        return iter_token_records(self.store, rollout_id, self.token_dir)

    def token_entries(self, rollout_id: str) -> list[dict[str, Any]]:
        """The rollout's training-token entries as Gym reads them (`read_token_entries`)."""
        return read_token_entries(self.token_dir or self.store, rollout_id)

    def trajectories(self, rollout_id: str) -> TrajectoryBuild:
        """The rollout's trajectories from its training-token file (`records.trajectories`)."""
        return trajectories(self.token_dir or self.store, rollout_id)

    def routed_experts(self, rollout_id: str, of: Union[Trajectory, TokenRecord, CallSpan, dict[str, Any]]
                       ) -> Optional[RoutedExperts]:
        """The routed experts of a trajectory (aligned with its tokens), a call's token record, or
        a reference (`records.read_routed_experts`)."""
        return read_routed_experts(self.token_dir or self, rollout_id, of)

    def end(self, rollout_id: str, outcome: Optional[dict[str, Any]] = None, group: Optional[str] = None,
            group_size: Optional[int] = None, *, allow_empty: bool = False) -> RolloutEnd:
        """End the rollout with its outcome, durably (`end_rollout`: an id that made no call is
        refused unless ``allow_empty``)."""
        return end_rollout(self.where, rollout_id, outcome, group, group_size, allow_empty=allow_empty)

    def ended(self, rollout_id: str) -> Optional[RolloutEnd]:
        """The rollout's end, or None while it has none (`read_rollout_end`)."""
        return read_rollout_end(self.where, rollout_id)

    def consumer(self, name: str, **options: Any) -> Consumer:
        """A durable consumer of the run's ended rollouts (`Consumer`; ``options`` are its own)."""
        return Consumer(self.where, name, **options)


def _path(where: object, taker: str) -> str:
    if isinstance(where, str):
        return where
    if isinstance(where, os.PathLike):
        path = os.fspath(where)
        if isinstance(path, str):
            return path
    raise TypeError(f"{taker} takes where the captures are: a capture directory (str or os.PathLike), a CaptureStore "
                    f"or a capture store's URL, not {type(where).__name__} {where!r:.80}")
