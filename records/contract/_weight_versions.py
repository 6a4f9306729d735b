"""Which policy weights sampled each generated token (docs/tokens.md, issue 32).

Asynchronous RL corrects for stale samples, so a trainer needs, per token, the weight version that
sampled it. Two sources, the engine's first:

- ``engine``: vLLM 0.33 (``return_weight_versions: true``, which the token capture mode adds) gives
  each choice ``weight_versions: [{"version", "start", "end"}]``, half-open ranges over its output
  token indexes (``vllm/outputs.py`` ``WeightVersionSpan``; streamed, on the choice's last chunk).
  SGLang 0.5.23 puts ``metadata.weight_version`` on every chat response: one version for the whole
  output; newer SGLang (``weight_version_spans.py``, sgl-project/sglang #35926) adds
  ``metadata.weight_versions``, the same spans over the output's token indexes, taken as they are.
- ``declared``: the trainer tells the sidecar (``POST /-/weight-version``) which version it has
  just loaded; the sidecar knows how many generated ids of each stream in flight had passed at
  that moment and splits the stream's span there. A non-streamed reply (or a stream without token
  ids) across an update cannot be split: it is marked ``weight_versions_unplaced``.

On a capture line: ``weight_versions`` (per choice, in the order of ``choices``; a span's ``end``
may be null: to the end of the generation), ``weight_version_source``, and
``weight_versions_unplaced`` when an update fell where it could not be placed.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Iterable, Optional

import orjson

ENGINE, DECLARED = "engine", "declared"
#: The declared versions in the order the trainer declared them (``POST /-/weight-version``), one
#: JSON line each, in the capture directory: the order a consumer counts staleness in.
DECLARED_VERSIONS_FILE = "weight-versions.jsonl"


def note_declared_version(capture_dir: str, version: str, declared_at: float) -> None:
    """Append a declared version to the capture directory's order of them, durably."""
    from ._appender import append_capture_line  # The same durable append as a capture line.

    append_capture_line(os.path.join(capture_dir, DECLARED_VERSIONS_FILE),
                        orjson.dumps({"version": version, "declared_at": declared_at}) + b"\n")


#: In a capture store: ``weight-versions/<declared_at in ns>-<random>.json``, an object per declaration.
DECLARED_VERSION_OBJECTS = "weight-versions"


def note_declared_version_in_store(store: Any, version: str, declared_at: float) -> None:
    """`note_declared_version` for a capture store (an `ObjectStore`): an object of its own."""
    name = f"{DECLARED_VERSION_OBJECTS}/{int(declared_at * 1e9):020d}-{uuid.uuid4().hex[:8]}.json"
    store.put(name, orjson.dumps({"version": version, "declared_at": declared_at}))


def declared_versions_in_store(store: Any, known: Optional[dict[str, str]] = None) -> list[str]:
    """The versions declared in a capture store, each once, in the order first declared; ``known``
    (object name -> version) keeps what was read before (declarations never change)."""
    known = {} if known is None else known
    for name in store.names(DECLARED_VERSION_OBJECTS):
        if name not in known:
            try:
                known[name] = orjson.loads(store.get(name)).get("version")
            except (FileNotFoundError, orjson.JSONDecodeError, AttributeError):
                continue
    order: dict[str, None] = {}
    for name in sorted(known):
        if type(known[name]) is str:
            order.setdefault(known[name], None)
    return list(order)


def declared_versions(capture_dir: str) -> list[str]:
    """The versions declared in the capture directory, each once, in the order first declared."""
    try:
        with open(os.path.join(capture_dir, DECLARED_VERSIONS_FILE), "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return []
    order: dict[str, None] = {}
    for line in data.split(b"\n"):
        try:
            version = orjson.loads(line).get("version") if line.strip() else None
        except (orjson.JSONDecodeError, AttributeError):
            continue  # A torn last line: never acknowledged.
        if type(version) is str:
            order.setdefault(version, None)
    return list(order)


def version_rank(versions: Iterable[str], declared: list[str]) -> dict[str, int]:
    """Each version's place in the documented order: the engine's integer versions by value when
    every one is an integer, else the order the trainer declared them; a version in neither has
    no place."""
    versions = list(versions)
    if versions and all(version.lstrip("-").isdigit() for version in versions):
        return {version: int(version) for version in versions}
    places = {version: place for place, version in enumerate(declared)}
    return {version: places[version] for version in versions if version in places}


def engine_weight_versions(response: Any) -> Optional[list[Optional[list[dict[str, Any]]]]]:
    """Per choice: the engine's spans (``end`` null for SGLang's one version), or None when the
    reply names no version."""
    if type(response) is not dict:
        return None
    choices = response.get("choices")
    count = len(choices) if type(choices) is list and choices else 1
    if type(choices) is list:
        for choice in choices:  # Most replies name none: told without a list made.
            if type(choice) is dict and choice.get("weight_versions") is not None:
                spans = [_spans(choice.get("weight_versions")) if type(choice) is dict else None for choice in choices]
                if any(found is not None for found in spans):
                    return spans
                break
    metadata = response.get("metadata")
    if type(metadata) is dict and metadata.get("weight_versions") is not None:
        spans_of_all = _spans(metadata.get("weight_versions"))  # SGLang's per-token spans: its one choice's.
        if spans_of_all is not None:
            return [spans_of_all for _ in range(count)]
    version = metadata.get("weight_version") if type(metadata) is dict else None
    if type(version) is str and version:
        return [[{"version": version, "start": 0, "end": None}] for _ in range(count)]
    return None


def resolved_spans(spans: Any, generated: Optional[int]) -> Optional[list[dict[str, Any]]]:
    """A line's spans of one choice with an open ``end`` closed at ``generated`` (the generation's
    length); None when there are none or they cannot be read."""
    checked = _spans(spans, open_end=True)
    if checked is None:
        return None
    closed = []
    for span in checked:
        end = span["end"]
        if end is None:
            if generated is None:
                return None
            end = generated
        if end < span["start"]:
            continue  # An update declared after the last token: an empty span.
        closed.append({"version": span["version"], "start": span["start"], "end": end})
    return closed or None


def token_versions(spans: Optional[list[dict[str, Any]]], generated: int) -> list[Optional[str]]:
    """One version per generated token (None where no span covers it)."""
    versions: list[Optional[str]] = [None] * generated
    for span in spans or ():
        start, end = max(0, span["start"]), min(generated, span["end"])
        if end > start:
            versions[start:end] = [span["version"]] * (end - start)
    return versions


def _spans(value: Any, open_end: bool = False) -> Optional[list[dict[str, Any]]]:
    if type(value) is not list or not value:
        return None
    spans = []
    for span in value:
        if type(span) is not dict or type(span.get("version")) is not str or type(span.get("start")) is not int:
            return None
        end = span.get("end")
        if not (type(end) is int or (open_end and end is None)):
            return None
        spans.append({"version": span["version"], "start": span["start"], "end": end})
    return spans
