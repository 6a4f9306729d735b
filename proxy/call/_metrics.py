"""Prometheus metrics of the sidecar, served at ``/-/metrics`` (issue 7; names follow Prometheus
conventions: ``mcc_`` prefix, ``_total`` counters, base units ``_seconds`` / ``_bytes``).

Each application gets its own registry, so several sidecars in one process (tests, the demo)
never share counters. Nothing here runs per chunk: calls are counted when they start and end.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

# Model calls last from milliseconds (a cached short reply) to many minutes (long reasoning).
_CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# The sidecar's own time on a call, by part (`CallOverhead`): microseconds on a quiet machine, up to
# tens of milliseconds for a long stream's parse or a line's fsync on a loaded disk.
_OVERHEAD_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                     0.1, 0.25, 1)
# fsync and the hold-back of a terminal chunk: sub-millisecond on local disks, more on NFS.
_DISK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)

CONTENT_TYPE = CONTENT_TYPE_LATEST


FeatureMetrics = TypeVar("FeatureMetrics")


class SidecarMetrics:
    """The call's metrics, on a registry of their own; each feature's metrics group (defined beside
    the feature: the token mode's in `proxy.training`, the WebSocket mode's in `proxy.websocket`)
    is on the same registry, made by `feature`."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        # process_resident_memory_bytes and friends: what to alert on before the memory limit
        # (deploy/README.md, "Sizing the sidecar").
        ProcessCollector(registry=registry)
        # With --workers N every scrape sums all workers' counters: one sample per worker counted.
        Gauge("mcc_worker_info", "One sample per sidecar process whose counts this scrape includes.", ["pid"],
              registry=registry).labels(str(os.getpid())).set(1)
        # The per-request metrics are plain Python values updated on the event loop's thread and
        # turned into Prometheus families at scrape time (`_LoopMetrics`): prometheus_client's
        # own take a lock per update, several per request (issue 5's profile: 7% of the loop).
        loop_metrics = _LoopMetrics()
        registry.register(loop_metrics)
        self.requests = loop_metrics.counter("mcc_requests", "Requests handled, by dialect (none when not observed), "
                                             "status class and whether the call was captured.",
                                             ("dialect", "status_class", "captured"))
        # Plain ints read at scrape time: a Gauge's inc/dec takes a lock twice per request.
        self.requests_in_flight = 0
        self.streams_in_flight = 0
        Gauge("mcc_requests_in_flight", "Requests being handled now.",
              registry=registry).set_function(lambda: self.requests_in_flight)
        Gauge("mcc_streams_in_flight", "Event-stream replies being relayed now.",
              registry=registry).set_function(lambda: self.streams_in_flight)
        self.request_duration = loop_metrics.histogram("mcc_request_duration_seconds", "Time from the request going "
                                                       "upstream to the end of the upstream exchange, for captured calls.",
                                                       ("dialect",), _CALL_BUCKETS)
        self.ttft = loop_metrics.histogram("mcc_time_to_first_token_seconds", "Time to the first body chunk that is not "
                                           "an SSE comment, for captured calls.", ("dialect",), _CALL_BUCKETS)
        self.capture_lines = loop_metrics.counter("mcc_capture_lines_written", "Capture lines appended and made durable.")
        self.capture_bytes = loop_metrics.counter("mcc_capture_bytes_written", "Bytes of capture lines appended.")
        self.fsync_duration = loop_metrics.histogram("mcc_capture_fsync_duration_seconds", "Duration of the durability "
                                                     "barrier (fsync or syncfs) of a capture line's batch.", (), _DISK_BUCKETS)
        self.terminal_holdback = loop_metrics.histogram("mcc_terminal_chunk_holdback_seconds", "How long the end of a "
                                                        "reply was held until its capture line was durable: every "
                                                        "captured call whose end waits for its line (a stream's last "
                                                        "chunk, a whole reply the token mode cut, a local answer).",
                                                        (), _DISK_BUCKETS)
        self.call_overhead = loop_metrics.histogram("mcc_call_overhead_seconds", "The sidecar's own time on a call, by "
                                                    "part (request, connect, head, first_byte, parse, line, redaction, "
                                                    "durable: docs/speed.md, \"Overhead by part\").", ("part",),
                                                    _OVERHEAD_BUCKETS)
        self.capture_failures = Counter("mcc_capture_failures_total", "Capture lines that could not be written, by kind.",
                                        ["kind"], registry=registry)
        self.upstream_errors = Counter("mcc_upstream_errors_total", "Upstream failures, by kind.", ["kind"],
                                       registry=registry)
        self.streams_truncated = Counter("mcc_streams_truncated_total", "2xx event streams that ended without "
                                         "their terminal event.", registry=registry)
        self.client_disconnects = Counter("mcc_client_disconnects_total", "Clients that went away before the reply "
                                          "ended.", registry=registry)
        self.undecodable_bodies = Counter("mcc_undecodable_bodies_total", "Request or reply bodies whose "
                                          "Content-Encoding the capture cannot decode (kept base64 on the line).",
                                          ["encoding"], registry=registry)
        self.left_after_end = Counter("mcc_client_left_after_end_total", "Clients that left after a stream's last "
                                      "meaningful event (every choice's finish reason, the usage asked for) and "
                                      "before its terminal ([DONE]): complete calls, not cancels.", registry=registry)
        self.uncaptured_calls = Counter("mcc_uncaptured_calls_total", "Model calls forwarded without capture, with "
                                        "capture on, because their path had no /ng-rollout/<id>/ prefix.",
                                        registry=registry)
        self._features: dict[Any, Any] = {}
        #: With capture on: the capture dir, checked for writability at scrape time.
        self.capture_dir: str | None = None
        #: Why the last capture line could not be written (a full disk), None after a success.
        self.capture_write_problem: str | None = None
        Gauge("mcc_capture_dir_writable", "1 when capture lines can be written (or capture is off): the capture "
              "dir is writable and the last line written was not refused (a full disk or quota, an I/O error); "
              "0 otherwise, until a line is written again. /-/ready stays 200 either way.",
              registry=registry).set_function(self._capture_dir_writable)

    def feature(self, group: Callable[[CollectorRegistry], FeatureMetrics]) -> FeatureMetrics:
        """The metrics group ``group`` of a feature on this registry, made the first time it is asked
        for (``group(registry)``): the composition asks for every feature's at start, so their
        names are scraped (at zero) whether or not the feature is on."""
        found = self._features.get(group)
        if found is None:
            found = self._features[group] = group(self.registry)
        return found

    def request_handled(self, dialect: str, status: int | None, captured: str) -> None:
        """One request at its end: ``mcc_requests`` by dialect, status class and capture."""
        self.requests.inc(1, (dialect, status_class(status), captured))

    def exchange_timed(self, dialect: str, duration: float, ttft: float | None) -> None:
        """A captured call's upstream exchange ended: its duration and time to first token."""
        self.request_duration.observe(duration, (dialect,))
        if ttft is not None:
            self.ttft.observe(ttft, (dialect,))

    def line_durable(self, size: int, barrier_seconds: float) -> None:
        """A capture line is durable (`capture.journal.JournalMetrics`): counted, its barrier timed."""
        self.capture_lines.inc()
        self.capture_bytes.inc(size)
        self.fsync_duration.observe(barrier_seconds)

    def _capture_dir_writable(self) -> float:
        if self.capture_dir is None:
            return 1.0
        return 1.0 if self.capture_write_problem is None and directory_writable(self.capture_dir) else 0.0


    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def directory_writable(path: str) -> bool:
    """Can this process create and append to files in ``path``?"""
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def status_class(status: int | None) -> str:
    return f"{status // 100}xx" if status else "none"


class LoopCounter:
    """A counter, or a family of them by label values, updated from the event loop's thread only."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name, self.documentation, self.label_names = name, documentation, labels
        self.values: dict[tuple[str, ...], float] = {} if labels else {(): 0.0}

    def inc(self, amount: float = 1.0, labels: tuple[str, ...] = ()) -> None:
        values = self.values
        values[labels] = values.get(labels, 0.0) + amount

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.label_names)
        for labels, value in self.values.items():
            family.add_metric(list(labels), value)
        return family


class LoopHistogram:
    """A histogram, or a family of them by label values, updated from the event loop's thread only."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> None:
        self.name, self.documentation, self.label_names = name, documentation, labels
        self.bounds = buckets
        #: Per label values: [count per bucket (the last is +Inf)..., sum].
        self.series: dict[tuple[str, ...], list[float]] = {} if labels else {(): [0] * (len(buckets) + 1) + [0.0]}

    def observe(self, value: float, labels: tuple[str, ...] = ()) -> None:
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = [0] * (len(self.bounds) + 1) + [0.0]
        series[bisect_left(self.bounds, value)] += 1  # `le` is inclusive: the first bound >= value.
        series[-1] += value

    def observe_each(self, observations: Iterable[tuple[tuple[str, ...], Optional[float]]]) -> None:
        """`observe` of each (labels, value) whose value is not None: a call's parts, in one call."""
        bounds, all_series = self.bounds, self.series
        for labels, value in observations:
            if value is not None:
                series = all_series.get(labels)
                if series is None:
                    series = all_series[labels] = [0] * (len(bounds) + 1) + [0.0]
                series[bisect_left(bounds, value)] += 1
                series[-1] += value

    def family(self) -> HistogramMetricFamily:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.label_names)
        for labels, series in self.series.items():
            cumulative: float = 0
            buckets: list[tuple[str, float]] = []
            for bound, count in zip((*self.bounds, float("inf")), series[:-1]):
                cumulative += count
                buckets.append((floatToGoString(bound), cumulative))
            family.add_metric(list(labels), buckets, series[-1])
        return family


class _LoopMetrics:
    """The registry's view of the loop-only counters and histograms, built at scrape time."""

    def __init__(self) -> None:
        self._metrics: list[LoopCounter | LoopHistogram] = []

    def counter(self, name: str, documentation: str, labels: tuple[str, ...] = ()) -> LoopCounter:
        counter = LoopCounter(name, documentation, labels)
        self._metrics.append(counter)
        return counter

    def histogram(self, name: str, documentation: str, labels: tuple[str, ...], buckets: tuple[float, ...]) -> LoopHistogram:
        histogram = LoopHistogram(name, documentation, labels, buckets)
        self._metrics.append(histogram)
        return histogram

    def collect(self) -> Iterator[Metric]:
        for metric in self._metrics:
            yield metric.family()
