"""Storage past one node (docs/files.md): with ``--capture-store``, the journal writes writer segments
in the capture dir (the spool), and an uploader process ships each sealed one to the store, then its
manifest (`capture.journal.UploaderProcess`)."""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

from capture.journal import SegmentPolicy, UploaderProcess, announce_writer
from records.contract.writing import STORE_SCHEMES

from ._declaration import Feature, Option, SettingsBase
from ._upload_metrics import UploadMetrics

log = logging.getLogger("mcc")
#: How long the start waits for the store to take this spool's writer object (never a failed start).
_ANNOUNCE_SECONDS = 5.0
_STORAGE = "Storage past one node"


def _store_url(value: Optional[str]) -> Optional[str]:
    if value is None:
        return value
    scheme, separator, rest = value.partition("://")
    if not separator or scheme not in STORE_SCHEMES or not rest.strip("/"):
        raise ValueError("must be a store URL: segments:///path, s3://bucket/prefix, gs://bucket/prefix or "
                         "az://container/prefix")
    if scheme == "segments" and not rest.startswith("/"):
        raise ValueError("a segments:// store takes an absolute path: segments:///data/store")
    return value.rstrip("/")


class StoreUploadFeature(Feature):
    """Writer segments in the spool, and the uploader that ships them (started after the journal, so
    what a restart found sealed goes first; stopped after it, within the drain's time)."""

    name = "store upload"
    options = (
        #: ``segments:///path`` (writer segments on a shared or local path), ``s3://bucket/prefix``,
        #: ``gs://...``, ``az://...`` (object storage). The capture dir is then this sidecar's spool.
        Option("capture_store", str | None, None, "Write-once storage past one node: segments:///path, "
               "s3://bucket/prefix, gs://..., az://...; the capture dir is then the local spool (off by default).",
               _STORAGE, metavar="URL", validate=_store_url, yaml_hint=True),
        #: A segment is sealed (and uploaded) at this size, or this many seconds after its first line.
        Option("segment_max_bytes", int, 64 * 1024 * 1024, "Seal (and upload) a writer segment at this size "
               "(default 64 MiB).", _STORAGE, bounds={"ge": 4096}),
        Option("segment_max_age", float, 60.0, "Seal (and upload) a writer segment this many seconds after it opened "
               "(default 60).", _STORAGE, bounds={"gt": 0}),
    )
    metrics = (UploadMetrics,)

    @classmethod
    def check(cls, settings: SettingsBase) -> None:
        if settings.capture_store is not None and not settings.capture_on:
            raise ValueError("--capture-store (MCC_CAPTURE_STORE) needs a local spool: pass --capture-dir DIR "
                             "(MCC_CAPTURE_DIR) on this node's own disk, with capture enabled")
        if settings.capture_store is not None and settings.token_dir is not None \
                and settings.token_dir != settings.capture_dir:
            raise ValueError("--capture-store (MCC_CAPTURE_STORE) ships the training-token files from the spool: "
                             "leave --token-dir (MCC_TOKEN_DIR) unset, or set it to the capture dir")

    @classmethod
    def wanted(cls, settings: SettingsBase) -> bool:
        return settings.capture_on and settings.capture_store is not None

    def prepare(self) -> None:
        settings, host = self.settings, self.host
        host.journal_segments = SegmentPolicy(settings.capture_dir, settings.segment_max_bytes,
                                              settings.segment_max_age)
        self.uploader = UploaderProcess(settings.capture_dir, settings.capture_store,
                                        token_idle=settings.segment_max_age)
        host.metrics.feature(UploadMetrics).upload_lag = self.uploader.lag
        # Known to every consumer before the first call (capture/journal/_watermark.py).
        problem = announce_writer(settings.capture_dir, settings.capture_store, _ANNOUNCE_SECONDS)
        if problem is not None:
            log.warning("cannot put this spool's writer object in %s before serving: %s; until its uploader reaches "
                        "the store, a consumer may hand out a rollout ended now without the lines of its calls made "
                        "here", settings.capture_store, problem)

    async def start(self) -> None:
        self.uploader.start()  # What a restart found sealed in the spool goes first.

    def ready(self) -> dict[str, object]:
        """Told, never a 503: a store's outage must not fail a call."""
        checks: dict[str, object] = {"capture_store": self.settings.capture_store,
                                     "upload_lag": self.uploader.lag().as_dict()}
        if self.uploader.problem is not None:
            checks["store_problem"] = self.uploader.problem
        return checks

    async def stop(self, timeout: float) -> None:
        # What it holds goes to the store, within the drain's time.
        await asyncio.get_running_loop().run_in_executor(None, self.uploader.stop, max(5.0, timeout))
