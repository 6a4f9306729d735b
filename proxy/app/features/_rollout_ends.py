"""The hand-off's ends (docs/wire.md, "Ending a rollout"; docs/reading.md, "One write barrier"):
``POST /-/rollouts/<rollout_id>/end`` and ``POST /-/run/end``, the refusal of a call for an ended
rollout, and this process's calls in flight published for the consumers' write barrier."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import orjson

from records.contract import ObjectStore

from ._admin_access import admin_refusal
from ._declaration import AdminAnswer, Feature, SettingsBase
from ._ended_rollouts import EndedRollouts, end_target
from ._in_flight import InFlightPublisher

if TYPE_CHECKING:
    from ...call import LocalReply, Route
    from ...http import ServerRequest

class RolloutEndsFeature(Feature):
    """With capture on: the ends of the capture dir (with a store, its objects), and the calls in flight."""

    name = "rollout ends"
    admin_paths = (("/-/rollouts/", "POST /-/rollouts/<rollout_id>/end"), ("/-/run/end", "POST /-/run/end"))
    #: Made by `prepare` (with capture on).
    ended: Optional[EndedRollouts] = None

    @classmethod
    def wanted(cls, settings: SettingsBase) -> bool:
        return settings.capture_on

    def prepare(self) -> None:
        settings = self.settings
        # With a store, ends are its objects; the uploader copies those it sees into the spool.
        self.ended = EndedRollouts(
            settings.capture_dir, settings.token_dir,
            ObjectStore(settings.capture_store) if settings.capture_store else None, self.host.metrics.registry)

    async def start(self) -> None:
        assert self.ended is not None
        calls = self.host.calls
        self.ended.in_flight = calls.rollouts_in_flight  # An end waits for its rollout's calls under way here.
        # (With a store, in the spool: its uploader holds such rollouts back.)
        self.in_flight = InFlightPublisher(self.settings.capture_dir, calls.rollouts_in_flight)
        self.ended.own_instance = self.in_flight.instance
        self.in_flight.start()

    def refusal(self, route: "Route") -> "Optional[tuple[LocalReply, str]]":
        return self.ended.refusal(route) if self.ended is not None else None

    async def serve_admin(self, path: bytes, request: "ServerRequest") -> Optional[AdminAnswer]:
        """``POST /-/rollouts/<rollout_id>/end`` (body optional: ``{"outcome": {...}, "group": "<key>",
        "group_size": G}``) and ``POST /-/run/end`` (body optional, any JSON object: the run is over,
        `records.end_run`); 200 once the end is durable (docs/wire.md, "Ending a rollout")."""
        if path == b"/-/run/end":
            refused = self._refusal(request, "run", "POST ends the run (every rollout of it has ended), with an "
                                                    "optional JSON object describing it")
            if refused is not None or self.ended is None:
                return refused
            return await self.ended.end_run(request.body)
        rollout_id = end_target(path)
        if rollout_id is None:  # /-/rollouts/<id>/<not end>: the 404 that lists the endpoints.
            return None
        refused = self._refusal(request, "rollout", "POST ends the rollout, with an optional body: "
                                                    '{"outcome": {...}, "group": "<key>", "group_size": G}',
                                rollout_id)
        if refused is not None or self.ended is None:
            return refused
        return await self.ended.end(rollout_id, request.body)

    def _refusal(self, request: "ServerRequest", what: str, how: str, rollout_id: str = "-") -> Optional[AdminAnswer]:
        """Why an end cannot be written: not a POST, no admin token, an invalid id, nothing captured."""
        if request.method != "POST":
            return 405, orjson.dumps({"error": how})
        refused = admin_refusal(self.settings, request)
        if refused is not None:
            return refused
        if not rollout_id:
            return 400, orjson.dumps({"error": "invalid rollout id: expected 1-200 characters of [A-Za-z0-9._-] "
                                               "starting with a letter or digit"})
        if self.ended is None:
            return 400, orjson.dumps({"error": f"this sidecar captures nothing (no --capture-dir): there is no {what} "
                                               "to end"})
        return None

    async def stop(self, timeout: float) -> None:
        self.in_flight.stop()  # Every call is done and its line written.
