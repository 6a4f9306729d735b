"""One consistent ``/-/metrics`` across ``--workers N`` (issue 15).

Each worker answers the scrapes that reach it (the kernel spreads connections over the workers),
and each counts only its own calls, so a Prometheus scraping the port saw counters go down and
up as different workers answered: counter resets. Instead, every worker writes its own
exposition to ``<metrics_dir>/<pid>.prom`` (atomically: a whole file or the previous one) once a
second and right before it answers a scrape, and answers with the sum over every worker's file.

Why the sum never goes down: each file only ever moves to a newer snapshot of one worker's
counters, which never go down, and each scrape reads every file once; so each term of the sum
is at least what the previous scrape read. A worker's part is at most a second old. Samples
named ``*_created`` (creation times) take the earliest; ``mcc_worker_info`` keeps one sample per
worker (its labels differ); the gauges of what the workers share (`SHARED_GAUGES`: the spool's
upload lag, the capture dir's writability) are not summed.
"""

from __future__ import annotations

import os
from typing import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

#: Gauges of what the workers share, not of each worker's own: one node's capture dir and spool,
#: which every worker reports whole. Summed, N workers would say N times the lag; so the lag takes
#: the largest worker's reading (the freshest look at one spool), writability the least (a worker
#: that cannot write is a capture dir that cannot be written).
SHARED_GAUGES = {"mcc_upload_lag_bytes": max, "mcc_upload_lag_segments": max, "mcc_upload_lag_seconds": max,
                 "mcc_capture_dir_writable": min}
#: How often a worker refreshes its snapshot between scrapes.
SNAPSHOT_INTERVAL_S = 1.0
_SUFFIX = ".prom"


def write_snapshot(directory: str, exposition: bytes) -> None:
    """Replace this process's snapshot with ``exposition`` (never a half-written file)."""
    path = os.path.join(directory, f"{os.getpid()}{_SUFFIX}")
    temporary = f"{path}.tmp"
    with open(temporary, "wb") as handle:
        handle.write(exposition)
    os.replace(temporary, path)


def retire(directory: str, pid: int) -> None:
    """A worker died: keep its counters and histograms in the sums (counters never go down), drop
    its gauges (in-flight counts it no longer has) and its ``mcc_worker_info`` sample."""
    path = os.path.join(directory, f"{pid}{_SUFFIX}")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return
    kept = [family for family in text_string_to_metric_families(text) if family.type != "gauge"]
    registry = CollectorRegistry()
    registry.register(_Merged(kept))
    retired = os.path.join(directory, f"retired-{pid}{_SUFFIX}")
    with open(retired + ".tmp", "wb") as handle:
        handle.write(generate_latest(registry))
    os.replace(retired + ".tmp", retired)
    os.unlink(path)
    try:
        os.unlink(path + ".tmp")
    except FileNotFoundError:
        pass


def merged_exposition(directory: str) -> bytes:
    """The sum of every worker's last snapshot, in the Prometheus text format."""
    texts = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(_SUFFIX):
            try:
                with open(os.path.join(directory, name), encoding="utf-8") as handle:
                    texts.append(handle.read())
            except FileNotFoundError:
                continue
    registry = CollectorRegistry()
    registry.register(_Merged(merge(texts)))
    return generate_latest(registry)


def merge(texts: Iterable[str]) -> list[Metric]:
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            samples = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in samples:
                    samples[key] = sample.value
                elif sample.name.endswith("_created"):
                    samples[key] = min(samples[key], sample.value)
                elif sample.name in SHARED_GAUGES:
                    samples[key] = SHARED_GAUGES[sample.name](samples[key], sample.value)
                else:
                    samples[key] += sample.value
    for name, metric in families.items():
        for (sample_name, labels), value in values[name].items():
            metric.add_sample(sample_name, dict(labels), value)
    return list(families.values())


class _Merged:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)
