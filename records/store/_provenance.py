"""Which engine served a call, read from its reply (docs/records.md): the fields a model server puts
in the bytes we already parse, so an engine upgraded mid-run shows up as such, not as unexplained
drift.

- ``system_fingerprint``: vLLM's is ``vllm-<version>[-<parallelism>...]-<config hash>``
  (``vllm-0.32.0-870eb8ba``; a tensor-parallel deployment: ``vllm-0.24.0-tp4-6d31f84d``); the
  engine and its version are read from it where it has that shape.
- ``usage.prompt_tokens_details``: ``created_cache_tokens`` (prompt tokens the call wrote to the
  engine's prefix cache) and ``multimodal_tokens``: a count, or vLLM's mapping by modality
  (``{"image": 576}``), kept as that mapping (``multimodal_tokens_by_modality``) beside its sum.
- ``metrics``: vLLM's per-request metrics object (``--enable-per-request-metrics``: queue time,
  time to first token, inter-token latency), kept as the engine wrote it.

The line keeps the reply as it came (a stream rebuilt keeps the envelope's fingerprint), so these
are read from every line ever captured, older ones included.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Optional

#: ``<engine>-<version>[-<parallelism>...][-<config hash>]``: vLLM's form (``vllm/entrypoints/openai``'s
#: ``get_system_fingerprint``); an engine name is letters, a version starts with a digit, a
#: parallelism tag is letters then a size (``tp4``, ``pp2``, ``dp8``).
_FINGERPRINT = re.compile(r"^([A-Za-z][A-Za-z_]*)-(\d[0-9A-Za-z.+]*?)((?:-[a-z]+\d+)*)(?:-([0-9a-f]{6,}))?$")

PROVENANCE_FIELDS = ("system_fingerprint", "engine", "engine_version", "created_cache_tokens", "multimodal_tokens",
                     "multimodal_tokens_by_modality", "engine_metrics")


@lru_cache(maxsize=256)
def _engine_of(fingerprint: str) -> tuple[Optional[str], Optional[str]]:
    """(engine, version) a fingerprint names, or (None, None); a run has a handful of fingerprints."""
    match = _FINGERPRINT.match(fingerprint)
    return (match.group(1).lower(), match.group(2)) if match is not None else (None, None)


def provenance_of(response: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The provenance fields of one reply (each None where the reply does not say). Read-only:
    a reply that says none of them gets one shared dict (the readers build a million records)."""
    if response is None:
        return _NOTHING
    fingerprint, metrics, usage = response.get("system_fingerprint"), response.get("metrics"), response.get("usage")
    details = usage.get("prompt_tokens_details") if type(usage) is dict else None
    if not fingerprint and type(details) is not dict and not metrics:
        return _NOTHING
    found: dict[str, Any] = dict.fromkeys(PROVENANCE_FIELDS)
    if type(fingerprint) is str:
        found["system_fingerprint"] = fingerprint
        found["engine"], found["engine_version"] = _engine_of(fingerprint)
    if type(details) is dict:
        for name in ("created_cache_tokens", "multimodal_tokens"):
            value = details.get(name)
            if type(value) is int and value >= 0:
                found[name] = value
        by_modality = details.get("multimodal_tokens")
        if type(by_modality) is dict and by_modality and all(
                type(count) is int and count >= 0 for count in by_modality.values()):
            found["multimodal_tokens_by_modality"] = by_modality
            found["multimodal_tokens"] = sum(by_modality.values())
    if type(metrics) is dict:
        found["engine_metrics"] = metrics
    return found


_NOTHING: dict[str, Any] = dict.fromkeys(PROVENANCE_FIELDS)
