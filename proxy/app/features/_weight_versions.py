"""The weight version the trainer declared (docs/reading.md): ``GET|POST /-/weight-version``, shared by
``--workers``, stamped on every captured call's line while one is declared (`proxy.training`)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Optional

import orjson

from records.contract import ObjectStore
from records.contract.writing import note_declared_version, note_declared_version_in_store

from ...training import DeclaredWeightVersions, WeightVersionHooks, declared_version
from ._admin_access import admin_refusal
from ._declaration import AdminAnswer, Feature, FeatureHost, SettingsBase

if TYPE_CHECKING:
    from ...call import CallHooks, Route
    from ...http import ServerRequest

log = logging.getLogger("mcc")


class WeightVersionsFeature(Feature):
    """The declared weight version: its endpoint, and its hooks on every captured call once declared."""

    name = "weight versions"
    admin_paths = (("/-/weight-version", "GET|POST /-/weight-version"),)

    @classmethod
    def wanted(cls, settings: SettingsBase) -> bool:
        return True

    def __init__(self, host: FeatureHost) -> None:
        super().__init__(host)
        settings = self.settings
        #: Shared by --workers through their metrics directory.
        self.board = DeclaredWeightVersions(settings.metrics_dir if settings.worker_index is not None else None)
        self.board.reread()  # A worker (re)started after a declaration takes it.

    def reread(self) -> None:
        self.board.reread()  # Another worker declared one (the supervisor signals every worker).

    def call_hooks(self, route: "Route") -> "Optional[CallHooks]":
        return WeightVersionHooks(self.board) if self.board.version is not None else None

    async def serve_admin(self, path: bytes, request: "ServerRequest") -> Optional[AdminAnswer]:
        """``GET`` the declared weight version; ``POST {"version": "<label>"}`` declares the one the
        trainer has just loaded (needs the admin token)."""
        if request.method in ("GET", "HEAD"):
            return 200, orjson.dumps(self.board.state())
        if request.method != "POST":
            return 405, orjson.dumps({"error": "GET reads the declared weight version; POST {\"version\": \"<label>\"} sets it"})
        refused = admin_refusal(self.settings, request)
        if refused is not None:
            return refused
        version, problem = declared_version(request.body)
        if version is None:
            return 400, orjson.dumps({"error": problem})
        self.board.declare(version)
        if self.settings.capture_on:  # The order a consumer counts staleness in (docs/reading.md).
            await self._note(version, self.board.state()["declared_at"])
        return 200, orjson.dumps(self.board.state())

    async def _note(self, version: str, declared_at: float) -> None:
        settings = self.settings
        loop = asyncio.get_running_loop()
        try:
            if settings.capture_store is not None:
                await loop.run_in_executor(None, note_declared_version_in_store, ObjectStore(settings.capture_store),
                                           version, declared_at)
            else:
                await loop.run_in_executor(None, note_declared_version, settings.capture_dir, version, declared_at)
        except Exception as exc:  # A store's refusal too: the declaration itself stands.
            log.warning("cannot note the declared weight version in %s: %s",
                        settings.capture_store or settings.capture_dir, exc)
