"""Prometheus metrics of the sidecar, served at ``/-/metrics`` (issue 7; names follow Prometheus
conventions: ``mcc_`` prefix, ``_total`` counters, base units ``_seconds`` / ``_bytes``).

Each application gets its own registry, so several sidecars in one process (tests, the demo)
never share counters. Nothing here runs per chunk: calls are counted when they start and end.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Model calls last from milliseconds (a cached short reply) to many minutes (long reasoning).
_CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# fsync and the hold-back of a terminal chunk: sub-millisecond on local disks, more on NFS.
_DISK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class SidecarMetrics:
    """Every metric the sidecar exports, on a registry of its own."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        # With --workers N each process has its own counters: this says which one answered.
        Gauge("mcc_worker_info", "The process that served this scrape.", ["pid"], registry=registry).labels(str(os.getpid())).set(1)
        self.requests = Counter("mcc_requests_total", "Requests handled, by dialect (none when not observed), "
                                "status class and whether the call was captured.",
                                ["dialect", "status_class", "captured"], registry=registry)
        # Plain ints read at scrape time: a Gauge's inc/dec takes a lock twice per request.
        self.requests_in_flight = 0
        self.streams_in_flight = 0
        Gauge("mcc_requests_in_flight", "Requests being handled now.",
              registry=registry).set_function(lambda: self.requests_in_flight)
        Gauge("mcc_streams_in_flight", "Event-stream replies being relayed now.",
              registry=registry).set_function(lambda: self.streams_in_flight)
        self.request_duration = Histogram("mcc_request_duration_seconds", "Time from the request going upstream "
                                          "to the end of the upstream exchange, for captured calls.",
                                          ["dialect"], buckets=_CALL_BUCKETS, registry=registry)
        self.ttft = Histogram("mcc_time_to_first_token_seconds", "Time to the first body chunk that is not an SSE "
                              "comment, for captured calls.", ["dialect"], buckets=_CALL_BUCKETS, registry=registry)
        self.capture_lines = Counter("mcc_capture_lines_written_total", "Capture lines appended and fsynced.",
                                     registry=registry)
        self.capture_bytes = Counter("mcc_capture_bytes_written_total", "Bytes of capture lines appended.",
                                     registry=registry)
        self.fsync_duration = Histogram("mcc_capture_fsync_duration_seconds", "Duration of the fsync of one capture line.",
                                        buckets=_DISK_BUCKETS, registry=registry)
        self.terminal_holdback = Histogram("mcc_terminal_chunk_holdback_seconds", "How long the chunk that ends a reply "
                                           "was held until its capture line was durable.", buckets=_DISK_BUCKETS,
                                           registry=registry)
        self.capture_failures = Counter("mcc_capture_failures_total", "Capture lines that could not be written, by kind.",
                                        ["kind"], registry=registry)
        self.upstream_errors = Counter("mcc_upstream_errors_total", "Upstream failures, by kind.", ["kind"],
                                       registry=registry)
        self.streams_truncated = Counter("mcc_streams_truncated_total", "2xx event streams that ended without "
                                         "their terminal event.", registry=registry)
        self.client_disconnects = Counter("mcc_client_disconnects_total", "Clients that went away before the reply "
                                          "ended.", registry=registry)

        # Labelled children, looked up once: `labels()` costs a lock and a tuple build per call.
        self._children: dict[tuple[object, ...], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached."""
        key = (id(metric), *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def status_class(status: int | None) -> str:
    return f"{status // 100}xx" if status else "none"
