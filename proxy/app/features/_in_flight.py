"""This sidecar process's calls in flight, published for the live hand-off's write barrier
(docs/reading.md, "One write barrier"; the format: `records.contract._calls_in_flight`).

Every `PUBLISH_SECONDS` the calls' context's ``rollouts_in_flight`` (a captured call counts from
before it is forwarded until its line is durable) is written to ``inflight/<instance>.json`` in
the capture directory, stamped with when it was read. The read and the stamp happen together on
the event loop, so a call that started before the stamp is in the publication; the write itself
runs on a worker thread. Nothing here is on a call's path.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from typing import Any, Optional

from records.contract.writing import PUBLISH_SECONDS, publish_in_flight, sweep_dead_publications, withdraw_in_flight

log = logging.getLogger("mcc")


class InFlightPublisher:
    """Publishes ``rollouts_in_flight`` (rollout id -> calls under way) of one sidecar process."""

    def __init__(self, directory: str, rollouts_in_flight: dict[str, int]) -> None:
        self.directory = directory
        self.rollouts_in_flight = rollouts_in_flight
        self.instance = f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        #: When each rollout in flight was first seen in flight (reported as ``since``).
        self._since: dict[str, float] = {}
        self._timer: Optional[asyncio.TimerHandle] = None
        self._writing = False
        self._stopped = False
        self._failed = False

    def start(self) -> None:
        try:
            sweep_dead_publications(self.directory)  # Those SIGKILLed sidecars left, long dead.
        except OSError:
            pass
        self._publish()

    def _publish(self) -> None:
        loop = asyncio.get_running_loop()
        if self._stopped:
            return
        self._timer = loop.call_later(PUBLISH_SECONDS, self._publish)
        if self._writing:
            return  # The last write is not done (a slow disk): the next tick publishes what is then.
        now = time.time()
        since = self._since
        for rollout_id in list(since):
            if rollout_id not in self.rollouts_in_flight:
                del since[rollout_id]
        rollouts: dict[str, dict[str, Any]] = {}
        for rollout_id, calls in self.rollouts_in_flight.items():
            rollouts[rollout_id] = {"calls": calls, "since": since.setdefault(rollout_id, now)}
        self._writing = True
        future = loop.run_in_executor(None, publish_in_flight, self.directory, self.instance, now, rollouts)
        future.add_done_callback(self._written)

    def _written(self, future: "asyncio.Future[None]") -> None:
        self._writing = False
        if self._stopped:  # Written after the stop: withdrawn again.
            self.stop()
            return
        failure = future.exception()
        if failure is not None and not self._failed:  # Said once: a consumer then waits its bound.
            self._failed = True
            log.warning("cannot publish this sidecar's calls in flight in %s: %s (a consumer holds ended rollouts "
                        "back until it can)", self.directory, failure)
        elif failure is None:
            self._failed = False

    def stop(self) -> None:
        """Drained: nothing of this process is in flight any more."""
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        try:
            withdraw_in_flight(self.directory, self.instance)
        except OSError:
            pass


__all__ = ["InFlightPublisher"]
