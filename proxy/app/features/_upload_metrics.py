"""A capture store's upload lag (docs/files.md, docs/operations.md), on the sidecar's registry
(`SidecarMetrics.feature`): zero without a store."""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Gauge


class UploadMetrics:
    """What is sealed and not yet in the capture store."""

    def __init__(self, registry: CollectorRegistry) -> None:
        #: With a capture store (docs/files.md): what is sealed and not yet uploaded (an `UploadLag`).
        #: The uploader's lag (an `UploadLag`), once one runs.
        self.upload_lag: Callable[[], Any] | None = None
        Gauge("mcc_upload_lag_bytes", "Bytes of sealed segments not yet in the capture store (0 without one).",
              registry=registry).set_function(lambda: self.upload_lag().bytes if self.upload_lag else 0)
        Gauge("mcc_upload_lag_segments", "Sealed segments not yet in the capture store.",
              registry=registry).set_function(lambda: self.upload_lag().segments if self.upload_lag else 0)
        Gauge("mcc_upload_lag_seconds", "Age of the oldest sealed segment not yet in the capture store.",
              registry=registry).set_function(lambda: self.upload_lag().oldest_seconds if self.upload_lag else 0)
