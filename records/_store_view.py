"""A store's rollouts as Gym's per-rollout files (DESIGN §14): what every reader reads a store URL as,
and what ``mcc compact`` writes.

A store holds, per writer, sealed segments (``segments/<writer_id>/<sha256>.jsonl``: lines of
``<rollout_id>\\t<capture line>``) and manifests written after them
(``manifests/<writer_id>/<sequence>.json``: the segment's name, sha256, size and rollouts). Only
what a manifest names is read, each segment once (by its sha256, whatever names it), its bytes
checked against the manifest. A rollout's lines are merged in the stated order: each writer's in
its append order (segment sequence, then line), across writers by ``completed_at``, then writer
id. Each rollout's file is written whole to a temporary name, then renamed (Gym's readers never
see part of one).

`store_view` keeps a cache (``MCC_STORE_CACHE``, else ``~/.cache/model-call-capture/stores``):
the segments it fetched (immutable), and a view directory whose files are rebuilt only for the
rollouts new manifests name, so a reader that reopens a store as it grows (a tail) pays for what
is new.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import os
import uuid
from pathlib import Path
from typing import Any, Iterable, Optional

import orjson

from ._file_contract import CAPTURE_SUFFIX, INCOMPLETE_SUFFIX
from ._object_store import ObjectStore

MANIFESTS = "manifests"
SEGMENT_OBJECTS = "segments"
#: ``incomplete/<rollout_id>``: a line of the rollout was lost (the spool's ``.capture.incomplete``).
INCOMPLETE_OBJECTS = "incomplete"
#: The training-token files (DESIGN §12): bundles of rollouts' files, each whole as its spool held
#: it (``tokens/<spool_id>/<sha256>.json``), and their manifests, written after them
#: (``token-manifests/<spool_id>/<time_ns>-<sha256 prefix>.json``); a rollout's latest wins.
TOKEN_OBJECTS = "tokens"
TOKEN_MANIFESTS = "token-manifests"
#: A rollout's training-token files, by suffix (`records._token_files`), in the order they merge.
TOKEN_FILE_SUFFIXES = (".tokens.jsonl", ".tokens.intents", ".tokens.incomplete", ".tokens.late.jsonl",
                       ".tokens.state.json")
_APPLIED = ".applied-manifests"


class SegmentDamaged(ValueError):
    """A segment's bytes are not those its manifest names."""


def manifest_name(writer_id: str, sequence: int) -> str:
    return f"{MANIFESTS}/{writer_id}/{sequence:010d}.json"


def incomplete_name(rollout_id: str) -> str:
    return f"{INCOMPLETE_OBJECTS}/{rollout_id}"


def token_bundle_name(spool_id: str, sha256: str) -> str:
    return f"{TOKEN_OBJECTS}/{spool_id}/{sha256}.json"


def token_manifest_name(spool_id: str, time_ns: int, sha256: str) -> str:
    return f"{TOKEN_MANIFESTS}/{spool_id}/{time_ns:020d}-{sha256[:16]}.json"


def segment_name(writer_id: str, sha256: str) -> str:
    return f"{SEGMENT_OBJECTS}/{writer_id}/{sha256}.jsonl"


def cache_root() -> Path:
    return Path(os.environ.get("MCC_STORE_CACHE") or Path.home() / ".cache" / "model-call-capture" / "stores")


def store_view(url: str, directory: Optional[str] = None, rollout_ids: Optional[Iterable[str]] = None) -> str:
    """Gym's per-rollout files of the store at ``url`` in ``directory`` (default: the store's view in
    the cache), for ``rollout_ids`` (default: every rollout); returns the directory."""
    store = ObjectStore(url)
    cache = cache_root() / hashlib.sha1(store.url.encode()).hexdigest()[:16]
    target = Path(directory) if directory is not None else cache / "view"
    target.mkdir(parents=True, exist_ok=True)
    wanted = set(rollout_ids) if rollout_ids is not None else None
    names = store.names(MANIFESTS)
    token_names = store.names(TOKEN_MANIFESTS)
    for marker in store.names(INCOMPLETE_OBJECTS):  # Lost lines, as the per-rollout layout marks them.
        rollout_id = marker.rpartition("/")[2]
        if wanted is None or rollout_id in wanted:
            (target / f"{rollout_id}{INCOMPLETE_SUFFIX}").touch()
    applied_path = target / _APPLIED
    applied = set(applied_path.read_text().split()) if applied_path.exists() else set()
    if wanted is None and applied == set(names) | set(token_names):
        return str(target)
    _rebuild_tokens(store, cache, target, [name for name in token_names if name not in applied or wanted is not None],
                    token_names, wanted)
    manifests = [_manifest(store, cache, name) for name in names]
    fresh = {name for name in names if name not in applied}
    touched: set[str] = set()
    for name, manifest in zip(names, manifests):
        if name in fresh or wanted is not None:
            touched.update(manifest.get("rollouts") or ())
    if wanted is not None:
        touched &= wanted
    _rebuild(store, cache, target, manifests, touched)
    if wanted is None:
        _write_atomically(applied_path, "\n".join([*names, *token_names]).encode())
    return str(target)


def _rebuild_tokens(store: ObjectStore, cache: Path, target: Path, fresh: list[str], every: list[str],
                    wanted: Optional[set[str]]) -> None:
    """The training-token files of the rollouts ``fresh`` token manifests name: each spool's latest
    snapshot of them; one spool's as it was (byte for byte, Gym's files), several spools' joined
    (their entries, intents and marks one after the other, by spool id, under a fresh state whose
    index readers bring up to the joined file's tail, as they do any lagging index)."""
    touched = set()
    for name in fresh:
        touched.update(_manifest(store, cache, name).get("rollouts") or ())
    if wanted is not None:
        touched &= wanted
    if not touched:
        return
    latest: dict[str, dict[str, str]] = {}  # rollout -> spool -> its latest manifest's name
    for name in every:  # Names sort by spool, then time.
        manifest = _manifest(store, cache, name)
        for rollout_id in manifest.get("rollouts") or ():
            if rollout_id in touched:
                latest.setdefault(rollout_id, {})[manifest["spool"]] = name
    for rollout_id, by_spool in latest.items():
        snapshots = [_token_snapshot(store, cache, _manifest(store, cache, by_spool[spool]), rollout_id)
                     for spool in sorted(by_spool)]
        for suffix in TOKEN_FILE_SUFFIXES:
            present = [snapshot[suffix] for snapshot in snapshots if suffix in snapshot]
            if not present:
                continue
            if len(snapshots) == 1:
                data = present[0]
            elif suffix == ".tokens.state.json":
                states = [orjson.loads(part) for part in present]
                data = orjson.dumps({"entry_digests": {}, "indexed_size": 0, "snapshot_id": "",
                                     "version": max(int(state.get("version") or 0) for state in states),
                                     **{flag: any(state.get(flag) for state in states)
                                        for flag in ("frozen", "incomplete", "retired")}})
            else:
                data = b"".join(part if part.endswith(b"\n") or not part else part + b"\n" for part in present)
            _write_atomically(target / f"{rollout_id}{suffix}", data)


def _token_snapshot(store: ObjectStore, cache: Path, manifest: dict[str, Any], rollout_id: str) -> dict[str, bytes]:
    sha = manifest["sha256"]
    local = cache / "tokens" / f"{sha}.json"
    if local.exists():
        data = local.read_bytes()
    else:
        data = store.get(manifest["bundle"])
        if hashlib.sha256(data).hexdigest() != sha:
            raise SegmentDamaged(f"{manifest['bundle']} in {store.url} is not the bundle its manifest names")
        local.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(local, data)
    files = orjson.loads(data)["rollouts"].get(rollout_id) or {}
    return {suffix: base64.b64decode(text) for suffix, text in files.items()}


def compact_store(url: str, directory: str, rollout_ids: Optional[Iterable[str]] = None) -> str:
    """Write Gym's per-rollout files (``<rollout_id>.capture.jsonl``) of the store at ``url`` into
    ``directory``, each atomically: every rollout, or ``rollout_ids``. Run again, it rewrites the
    rollouts that new segments added lines to. Returns the directory."""
    return store_view(url, directory, rollout_ids)


def store_rollout_sizes(url: str) -> dict[str, int]:
    """Each rollout of the store and about how many bytes of lines it has (a segment's bytes shared
    among the rollouts its manifest names): read from the manifests alone, to plan reads by."""
    store = ObjectStore(url)
    cache = cache_root() / hashlib.sha1(store.url.encode()).hexdigest()[:16]
    sizes: dict[str, int] = {}
    seen: set[str] = set()
    for name in store.names(MANIFESTS):
        manifest = _manifest(store, cache, name)
        rollouts = manifest.get("rollouts") or []
        if manifest["sha256"] in seen or not rollouts:
            continue
        seen.add(manifest["sha256"])
        share = max(1, int(manifest.get("bytes", 0)) // len(rollouts))
        for rollout_id in rollouts:
            sizes[rollout_id] = sizes.get(rollout_id, 0) + share
    for marker in store.names(INCOMPLETE_OBJECTS):  # A rollout whose lines were all lost still counts.
        sizes.setdefault(marker.rpartition("/")[2], 0)
    return dict(sorted(sizes.items()))


def _manifest(store: ObjectStore, cache: Path, name: str) -> dict[str, Any]:
    local = cache / name
    if local.exists():
        return orjson.loads(local.read_bytes())
    data = store.get(name)
    local.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(local, data)
    return orjson.loads(data)


def _segment(store: ObjectStore, cache: Path, manifest: dict[str, Any]) -> bytes:
    sha = manifest["sha256"]
    local = cache / "segments" / f"{sha}.jsonl"
    if local.exists():
        return local.read_bytes()
    data = store.get(manifest["segment"])
    if hashlib.sha256(data).hexdigest() != sha:
        raise SegmentDamaged(f"{manifest['segment']} in {store.url} is not the segment its manifest names "
                             f"(sha256 {sha})")
    local.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(local, data)
    return data


def _rebuild(store: ObjectStore, cache: Path, target: Path, manifests: list[dict[str, Any]], rollouts: set[str]) -> None:
    """Rewrite the files of ``rollouts`` from every segment that names them."""
    if not rollouts:
        return
    seen: set[str] = set()
    by_writer: dict[str, dict[str, list[bytes]]] = {}
    ordered = sorted(manifests, key=lambda m: (m["writer"], m["sequence"]))
    for manifest in ordered:
        if manifest["sha256"] in seen or not rollouts.intersection(manifest.get("rollouts") or ()):
            continue
        seen.add(manifest["sha256"])
        lines = by_writer.setdefault(manifest["writer"], {})
        for raw in _segment(store, cache, manifest).split(b"\n")[:-1]:  # The last piece: b"", or torn.
            rollout, tab, line = raw.partition(b"\t")
            if not tab or not line:
                continue  # A blank line (after an append that failed part-way) or a torn one: skipped.
            rollout_id = rollout.decode()
            if rollout_id in rollouts and _whole(line):
                lines.setdefault(rollout_id, []).append(line)
    for rollout_id in rollouts:
        streams = [(writer, per_rollout[rollout_id]) for writer, per_rollout in sorted(by_writer.items())
                   if rollout_id in per_rollout]
        merged = merge_writers(streams)
        _write_atomically(target / f"{rollout_id}{CAPTURE_SUFFIX}", b"".join(line + b"\n" for line in merged))


def _whole(line: bytes) -> bool:
    """A line an append wrote whole (one JSON object): the piece of one that failed part-way is not."""
    try:
        return isinstance(orjson.loads(line), dict)
    except orjson.JSONDecodeError:
        return False


def merge_writers(streams: list[tuple[str, list[bytes]]]) -> list[bytes]:
    """One rollout's lines from several writers: each writer's in its own order, across writers by
    ``completed_at`` (a line without one sorts with the one before it), then writer id."""
    if len(streams) == 1:
        return streams[0][1]

    def keyed(writer: str, lines: list[bytes]) -> Iterable[tuple[float, str, int, bytes]]:
        last = float("-inf")
        for number, line in enumerate(lines):
            try:
                completed = orjson.loads(line).get("completed_at")
            except (orjson.JSONDecodeError, AttributeError):
                completed = None
            last = max(last, completed) if isinstance(completed, (int, float)) else last
            yield last, writer, number, line

    return [line for *_, line in heapq.merge(*(keyed(writer, lines) for writer, lines in streams))]


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


__all__ = ["INCOMPLETE_OBJECTS", "MANIFESTS", "SEGMENT_OBJECTS", "SegmentDamaged", "TOKEN_FILE_SUFFIXES",
           "TOKEN_MANIFESTS", "TOKEN_OBJECTS", "compact_store", "incomplete_name", "manifest_name", "store_rollout_sizes",
           "token_bundle_name", "token_manifest_name", "merge_writers", "segment_name",
           "store_view"]
