"""Ended rollouts on the sidecar: ``POST /-/rollouts/<rollout_id>/end`` and the refusal of later
calls (docs/wire.md, "Ending a rollout").

The end itself is `records.contract.write_rollout_end` (a file of its own beside the rollout's, created
exclusively and durably). An end is Gym's freeze: a call that arrives for an ended rollout is
answered 409 in its dialect's error shape and recorded as such (`EndedRollouts.refusal`, the
calls' context's ``refusal``). Any
sidecar sharing the capture directory may have ended it, so each captured call looks for the
rollout's end (one ``stat``); an end seen once is remembered (an end is never undone).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Optional
from urllib.parse import unquote

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge

from records.contract import (
    GroupSizeConflict, ObjectStore, RolloutEnd, RolloutEndConflict, UnknownRollout, is_valid_rollout_id,
    read_end_object, wait_until_quiet, write_rollout_end, write_run_end, write_store_end, write_store_run_end,
)
from records.contract.writing import (
    end_lookup, end_request, ended_in_spool, is_ended, mark_ended_in_spool, require_store_rollout,
)

from ...call import ROLLOUT_ENDED, LocalReply, Route

_PREFIX, _SUFFIX = b"/-/rollouts/", b"/end"
#: An end waits this long at most for its rollout's calls under way on this sidecar to finish.
WAIT_FOR_CALLS_S = 30.0
#: Ends remembered by one sidecar (a set of ids; older ones are looked up again: one stat).
_REMEMBERED = 100_000
#: A rollout with calls and no end is unended once its last call here is this old (`records.Consumer`'s
#: ``unended_seconds`` default too).
UNENDED_AFTER_S = 300.0


class EndedRollouts:
    """The ends of one capture directory, as this sidecar knows them; with a capture store
    (``store``), ``capture_dir`` is the sidecar's spool and the ends are the store's objects
    (``ends/<rollout_id>.json``), which its uploader copies into the spool as it sees them."""

    def __init__(self, capture_dir: str, token_dir: Optional[str] = None, store: Optional[ObjectStore] = None,
                 registry: Optional[CollectorRegistry] = None) -> None:
        self.capture_dir = capture_dir
        #: Calls refused because their rollout had ended (recorded ``rollout_ended``; not turns).
        self.calls_after_end = Counter("mcc_calls_after_end_total", "Calls refused (409) because their rollout had "
                                       "ended: recorded with error_category rollout_ended, never a turn.",
                                       registry=registry)
        self.token_dir = token_dir
        self.store = store
        #: Whether a call's rollout (its id validated by the route) has an end on disk: one access.
        self._has_end = end_lookup(capture_dir, spool=store is not None)
        self._ended: set[str] = set()
        #: Rollouts being ended here: their new calls are refused while the calls under way finish.
        self._ending: set[str] = set()
        #: Captured calls under way by rollout (the calls' context's: `CallContext.rollouts_in_flight`).
        self.in_flight: dict[str, int] = {}
        #: Rollouts that made calls here and had no end then: when each last did (oldest first), and
        #: when its end was last looked for (`unended`).
        self._idle: OrderedDict[str, float] = OrderedDict()
        self._looked: dict[str, float] = {}
        self.unended_after = UNENDED_AFTER_S
        #: This process's own publication of its calls in flight (its end knows them already).
        self.own_instance: Optional[str] = None
        Gauge("mcc_rollouts_unended", "Rollouts this sidecar process served calls for that have no end and made no "
              f"call for {UNENDED_AFTER_S:g} s (a crashed runner, an end sent with a typo'd id).",
              registry=registry).set_function(self.unended)

    def ended(self, rollout_id: str) -> bool:
        if rollout_id in self._ended or rollout_id in self._ending:
            return True
        if (ended_in_spool if self.store is not None else is_ended)(self.capture_dir, rollout_id):
            self._remember(rollout_id)
            return True
        return False

    def _called(self, rollout_id: str) -> None:
        """A call of the rollout came (and it has no end)."""
        self._idle[rollout_id] = time.time()
        self._idle.move_to_end(rollout_id)
        if len(self._idle) > _REMEMBERED:
            forgotten, _ = self._idle.popitem(last=False)
            self._looked.pop(forgotten, None)

    def unended(self) -> int:
        """How many rollouts idle here for over ``unended_after`` have no end: each looked up (one
        ``stat``) at most once a minute, a bounded number per scrape."""
        now, looks, count = time.time(), 0, 0
        for rollout_id, at in list(self._idle.items()):
            if now - at < self.unended_after:
                break  # Oldest first: the rest called later.
            if self.in_flight.get(rollout_id):
                continue  # A long call under way.
            if now - self._looked.get(rollout_id, 0.0) >= 60.0 and looks < 1000:
                looks += 1
                self._looked[rollout_id] = now
                if self.ended(rollout_id):  # (Forgotten here: `_remember`.)
                    self._idle.pop(rollout_id, None)
                    self._looked.pop(rollout_id, None)
                    continue
            count += 1
        return count

    def _remember(self, rollout_id: str) -> None:
        self._idle.pop(rollout_id, None)
        if len(self._ended) >= _REMEMBERED:
            self._ended.clear()
        self._ended.add(rollout_id)

    async def end(self, rollout_id: str, body: bytes) -> tuple[int, bytes]:
        """Answer an end's request: 200 once the end is durable, 400 for a bad body, 409 for an
        end that differs from the one there."""
        try:
            outcome, group, group_size, allow_empty = end_request(body)
        except ValueError as exc:
            return 400, orjson.dumps({"error": str(exc)})
        self._ending.add(rollout_id)
        try:
            return await self._end_when_quiet(rollout_id, outcome, group, group_size, allow_empty)
        finally:
            self._ending.discard(rollout_id)

    async def _end_when_quiet(self, rollout_id: str, outcome: Optional[dict[str, object]], group: Optional[str],
                              group_size: Optional[int], allow_empty: bool) -> tuple[int, bytes]:
        """The end written once the rollout's calls under way here, and on the other sidecars of the
        capture directory, have written their lines (for at most `WAIT_FOR_CALLS_S`): the same wait
        as `records.end_rollout`'s, so both ends give the same rollout (docs/reading.md)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_FOR_CALLS_S
        in_flight_here = bool(self.in_flight.get(rollout_id))
        while self.in_flight.get(rollout_id) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        if self.store is None and deadline > loop.time():
            await loop.run_in_executor(None, wait_until_quiet, self.capture_dir, rollout_id, deadline - loop.time(),
                                       self.own_instance)
        try:
            end = await loop.run_in_executor(None, self._write_end, rollout_id, outcome, group, group_size,
                                             allow_empty or in_flight_here)
        except UnknownRollout as unknown:
            return 404, orjson.dumps({"error": str(unknown), "code": "unknown_rollout", "rollout_id": rollout_id})
        except RolloutEndConflict as conflict:
            self._remember(rollout_id)
            return 409, orjson.dumps({"error": str(conflict), "rollout_id": rollout_id,
                                      "ended_at": conflict.existing.ended_at})
        except GroupSizeConflict as conflict:
            return 409, orjson.dumps({"error": str(conflict), "rollout_id": rollout_id})
        except OSError as exc:
            return 503, orjson.dumps({"error": f"the end could not be written: {exc.strerror or exc}"})
        except Exception as exc:  # A capture store's refusal (down, no credentials): nothing was ended.
            return 503, orjson.dumps({"error": f"the end could not be written to the capture store: "
                                               f"{type(exc).__name__}: {exc}"[:500]})
        self._remember(rollout_id)
        return 200, orjson.dumps({"rollout_id": end.rollout_id, "ended_at": end.ended_at, "calls": end.calls})

    def _write_end(self, rollout_id: str, outcome: Optional[dict[str, object]], group: Optional[str],
                   group_size: Optional[int], allow_empty: bool = False) -> RolloutEnd:
        if self.store is None:
            return write_rollout_end(self.capture_dir, rollout_id, outcome, group, group_size, self.token_dir,
                                     allow_empty=allow_empty)[0]
        # Known (its calls came here, or a writer names it) before anything is frozen; then frozen and
        # refused here (no entry, no call after the end), then the end itself.
        known_here = rollout_id in self._idle or bool(self.in_flight.get(rollout_id))
        if not (allow_empty or known_here or read_end_object(self.store, rollout_id) is not None):
            require_store_rollout(self.store, rollout_id)
        mark_ended_in_spool(self.capture_dir, rollout_id)
        return write_store_end(self.store, rollout_id, outcome, group, group_size, allow_empty=True)[0]

    async def end_run(self, body: bytes) -> tuple[int, bytes]:
        """Answer ``POST /-/run/end``: 200 once the run's end is durable, 400 for a bad body."""
        try:
            info = orjson.loads(body) if body.strip() else None
        except orjson.JSONDecodeError as exc:
            return 400, orjson.dumps({"error": f"the body is not JSON: {exc}"})
        store = self.store
        try:
            if store is not None:
                record = await asyncio.get_running_loop().run_in_executor(None, write_store_run_end, store, info)
            else:
                record = await asyncio.get_running_loop().run_in_executor(None, write_run_end, self.capture_dir, info)
        except ValueError as exc:
            return 400, orjson.dumps({"error": str(exc)})
        except Exception as exc:  # A disk's or a store's refusal: nothing was ended.
            return 503, orjson.dumps({"error": f"the run's end could not be written: {type(exc).__name__}: {exc}"[:500]})
        return 200, orjson.dumps(record)

    def refusal(self, route: Route) -> Optional[tuple[LocalReply, str]]:
        """A captured call's refusal when its rollout has ended (`CallContext.refusal`)."""
        rollout_id = route.rollout_id
        if not rollout_id:
            return None
        if rollout_id in self._ended or rollout_id in self._ending:
            ended = True
        else:  # The route's id is a valid one: its end's path is made without checking it again.
            ended = self._has_end(rollout_id)
            if ended:
                self._remember(rollout_id)
        if not ended:
            self._called(rollout_id)
            return None
        self.calls_after_end.inc()
        return ROLLOUT_ENDED, (f"rollout {rollout_id} has ended (POST /-/rollouts/{rollout_id}/end): it takes no "
                               "more calls; start a new rollout id")


def end_target(path: bytes) -> Optional[str]:
    """The rollout id of an end's path (``/-/rollouts/<id>/end``, percent-decoded), "" when the
    path is an end's with an invalid id, None when it is not an end's path."""
    if not (path.startswith(_PREFIX) and path.endswith(_SUFFIX)):
        return None
    rollout_id = unquote(path[len(_PREFIX):-len(_SUFFIX)].decode("latin-1"))
    return rollout_id if is_valid_rollout_id(rollout_id) else ""
