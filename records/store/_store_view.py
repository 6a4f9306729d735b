"""A store's rollouts as Gym's per-rollout files (docs/files.md): what every reader reads a store URL as,
and what ``mcc compact`` writes.

A store holds, per writer, sealed segments (``segments/<writer_id>/<sha256>.jsonl``: lines of
``<rollout_id>\\t<capture line>``) and manifests written after them
(``manifests/<writer_id>/<sequence>.json``: the segment's name, sha256, size, rollouts, and each
rollout's lines' ``completed_at`` in append order, so a reader can place every line of a segment
in its rollout from the manifests alone: `plan_segment_reads`). Only
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
import fcntl
import hashlib
import os
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Union

import orjson

from ..contract.reading import NothingUploadedYet, StoreNotFound
from ..contract import (
    CAPTURE_SUFFIX, INCOMPLETE_SUFFIX, ObjectStore, TOKEN_FILE_SUFFIXES, incomplete_name, manifest_name, segment_name,
    segment_order, token_bundle_name, token_manifest_name,
)
from ..contract.reading import (
    INCOMPLETE_OBJECTS, MANIFESTS, SEGMENT_OBJECTS, TOKEN_MANIFESTS, TOKEN_OBJECTS, merge_order, merge_writers,
    whole_segment_lines,
)
from ._token_join import join_entries

_APPLIED = ".applied-manifests"
#: A view's place in its store: each writer's and spool's last manifest applied (`_follow`).
_STATE = ".view-state.json"


class SegmentDamaged(ValueError):
    """A segment's bytes are not those its manifest names."""


def cache_root() -> Path:
    return Path(os.environ.get("MCC_STORE_CACHE") or Path.home() / ".cache" / "model-call-capture" / "stores")


def store_view(url: str, directory: Optional[str] = None, rollout_ids: Optional[Iterable[str]] = None,
               allow_empty: bool = False) -> str:
    """Gym's per-rollout files of the store at ``url`` in ``directory`` (default: the store's view in
    the cache), for ``rollout_ids`` (default: every rollout); returns the directory. A store with
    nothing in it raises `StoreNotFound` (no writer ever seen: the URL points nowhere) or
    `NothingUploadedYet` (its sidecars have not sealed a segment yet), unless ``allow_empty``."""
    store = ObjectStore(url)
    cache = cache_root() / hashlib.sha1(store.url.encode()).hexdigest()[:16]
    target = Path(directory) if directory is not None else cache / "view"
    target.mkdir(parents=True, exist_ok=True)
    # One rebuilder of a view at a time, across processes (a trainer's ranks share the cache): two at
    # once could rename a rollout's file built from fewer manifests over one built from more, after
    # the other had said those manifests applied, and the view would stay short of lines.
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "rebuild.lock", "w") as lock:  # (In the store's cache: never in a compacted directory.)
        fcntl.flock(lock, fcntl.LOCK_EX)  # Released when the file closes (or the process dies).
        return _store_view_locked(store, cache, target, rollout_ids, allow_empty)


def _store_view_locked(store: ObjectStore, cache: Path, target: Path, rollout_ids: Optional[Iterable[str]],
                       allow_empty: bool) -> str:
    wanted = set(rollout_ids) if rollout_ids is not None else None
    if wanted is None and (target / _STATE).exists():
        return _follow(store, cache, target)
    names = store.names(MANIFESTS)
    token_names = store.names(TOKEN_MANIFESTS)
    if not names and not token_names and not allow_empty:
        _say_empty(store)
    for marker in store.names(INCOMPLETE_OBJECTS):  # Lost lines, as the per-rollout layout marks them.
        rollout_id = marker.rpartition("/")[2]
        if wanted is None or rollout_id in wanted:
            (target / f"{rollout_id}{INCOMPLETE_SUFFIX}").touch()
    applied_path = target / _APPLIED
    applied = set(applied_path.read_text().split()) if applied_path.exists() else set()
    if wanted is None and applied == set(names) | set(token_names):
        return str(target)
    manifests = [_manifest(store, cache, name) for name in names]
    fresh = {name for name in names if name not in applied}
    touched: set[str] = set()
    for name, manifest in zip(names, manifests):
        if name in fresh or wanted is not None:
            touched.update(manifest.get("rollouts") or ())
    if wanted is not None:
        touched &= wanted
    _rebuild(store, cache, target, manifests, touched)
    # Then the token files: joining several spools' entries reads the calls' requests (new lines
    # of a rollout may link its entries: rebuilt too).
    _rebuild_tokens(store, cache, target, [name for name in token_names if name not in applied or wanted is not None],
                    token_names, wanted, touched)
    if wanted is None:  # What it rebuilt is durable before it is said applied.
        _note_rollouts(store, cache, [*names, *token_names])
        _barrier(target)
        _write_atomically(applied_path, "\n".join([*names, *token_names]).encode())
        _write_atomically(target / _STATE, orjson.dumps({"manifests": _last_by_folder(names),
                                                          "tokens": _last_by_folder(token_names)}))
    return str(target)


def _follow(store: ObjectStore, cache: Path, target: Path) -> str:
    """A view brought up to date from where it was (its state: each writer's and spool's last
    manifest applied): each folder listed after that name (a start-after), the rollouts the new
    manifests name rebuilt from the manifests that name them (the cache's index by rollout). What
    it reads grows with what is new (and the number of writers), not with the store."""
    state = orjson.loads((target / _STATE).read_bytes())
    fresh = _names_after_state(store, MANIFESTS, state["manifests"])
    fresh_tokens = _names_after_state(store, TOKEN_MANIFESTS, state["tokens"])
    for marker in store.names(INCOMPLETE_OBJECTS):  # Lost lines, as the per-rollout layout marks them (few).
        (target / f"{marker.rpartition('/')[2]}{INCOMPLETE_SUFFIX}").touch()
    if not fresh and not fresh_tokens:
        return str(target)
    _note_rollouts(store, cache, [*fresh, *fresh_tokens])
    touched: set[str] = set()
    for name in fresh:
        touched.update(_manifest(store, cache, name).get("rollouts") or ())
    named = {rollout_id: _named(cache, rollout_id) for rollout_id in touched}
    line_manifests = sorted({name for names in named.values() for name in names if name.startswith(MANIFESTS + "/")})
    _rebuild(store, cache, target, [_manifest(store, cache, name) for name in line_manifests], touched)
    token_touched = set(touched)
    for name in fresh_tokens:
        token_touched.update(_manifest(store, cache, name).get("rollouts") or ())
    every = sorted({name for rollout_id in token_touched for name in _named(cache, rollout_id)
                    if name.startswith(TOKEN_MANIFESTS + "/")})
    _rebuild_tokens(store, cache, target, fresh_tokens, every, None, touched)
    _barrier(target)
    state["manifests"].update(_last_by_folder(fresh))
    state["tokens"].update(_last_by_folder(fresh_tokens))
    _write_atomically(target / _STATE, orjson.dumps(state))
    return str(target)


def _names_after_state(store: ObjectStore, prefix: str, last: dict[str, str]) -> list[str]:
    """The names in each folder of ``prefix`` after the last one applied (a folder's names sort in
    the order it wrote them: a sequence, a time)."""
    found = []
    for folder in store.children(prefix):
        found += store.names_after(f"{prefix}/{folder}", last.get(folder) or f"{prefix}/{folder}/")
    return found


def _last_by_folder(names: list[str]) -> dict[str, str]:
    last: dict[str, str] = {}
    for name in names:
        folder = name.split("/")[1]
        if name > last.get(folder, ""):
            last[folder] = name
    return last


def _note_rollouts(store: ObjectStore, cache: Path, names: list[str]) -> None:
    """The cache's index by rollout: each manifest's name under each rollout it names
    (``by-rollout/<rollout_id>``), so a rollout is rebuilt from its own manifests alone."""
    by_rollout: dict[str, list[str]] = {}
    for name in names:
        for rollout_id in _manifest(store, cache, name).get("rollouts") or ():
            by_rollout.setdefault(rollout_id, []).append(name)
    folder = cache / "by-rollout"
    folder.mkdir(parents=True, exist_ok=True)
    for rollout_id, listed in by_rollout.items():
        with open(folder / rollout_id, "a", encoding="utf-8") as handle:
            handle.write("".join(f"{name}\n" for name in listed))


def _named(cache: Path, rollout_id: str) -> list[str]:
    try:
        return sorted(set((cache / "by-rollout" / rollout_id).read_text(encoding="utf-8").split()))
    except FileNotFoundError:
        return []


def _say_empty(store: ObjectStore) -> None:
    """A store with no manifest: whether sidecars write to it (nothing sealed yet) or none ever did."""
    from ..contract.reading import WRITER_OBJECTS

    writers = store.names(WRITER_OBJECTS)
    if writers:
        raise NothingUploadedYet(f"nothing uploaded to {store.url} yet: {len(writers)} sidecar(s) write to it, and a "
                                 "segment is uploaded once sealed (--segment-max-age, 60 s by default); "
                                 "--allow-empty reads it as empty meanwhile")
    raise StoreNotFound(f"{store.url}: no capture store there (no manifest, and no sidecar ever wrote to it): check the "
                        "URL, bucket and prefix; --allow-empty reads it as empty (a collector that starts first)")


def _rebuild_tokens(store: ObjectStore, cache: Path, target: Path, fresh: list[str], every: list[str],
                    wanted: Optional[set[str]], lines_touched: set[str]) -> None:
    """The training-token files of the rollouts ``fresh`` token manifests name (and of those
    ``lines_touched`` that have any): each spool's latest snapshot of them; one spool's as it was
    (byte for byte, Gym's files), several spools' joined (their entries, intents and marks one
    after the other, by spool id, the calls one spool could not resolve linked to the other's
    they continue, `join_entries`, under a fresh state whose index readers bring up to the joined
    file's tail, as they do any lagging index)."""
    shipped: set[str] = set()
    for name in fresh:
        shipped.update(_manifest(store, cache, name).get("rollouts") or ())
    touched = shipped | lines_touched
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
        if rollout_id not in shipped and len(by_spool) == 1:
            continue  # New lines, no new token files, nothing to join: as they were.
        snapshots = [_token_snapshot(store, cache, _manifest(store, cache, by_spool[spool]), rollout_id)
                     for spool in sorted(by_spool)]
        for suffix in TOKEN_FILE_SUFFIXES:
            present = [snapshot[suffix] for snapshot in snapshots if suffix in snapshot]
            if not present:
                continue
            if len(snapshots) == 1:
                data = present[0]
            elif suffix == ".tokens.jsonl":
                capture = target / f"{rollout_id}{CAPTURE_SUFFIX}"
                data = join_entries(present, capture.read_bytes() if capture.exists() else b"")
            elif suffix == ".tokens.state.json":
                states = [orjson.loads(part) for part in present]
                data = orjson.dumps({"entry_digests": {}, "indexed_size": 0, "snapshot_id": "",
                                     "version": max(int(state.get("version") or 0) for state in states),
                                     **{flag: any(state.get(flag) for state in states)
                                        for flag in ("frozen", "incomplete", "retired")}})
            else:
                data = b"".join(part if part.endswith(b"\n") or not part else part + b"\n" for part in present)
            _write_atomically(target / f"{rollout_id}{suffix}", data, durable=False)


def _token_snapshot(store: ObjectStore, cache: Path, manifest: dict[str, Any], rollout_id: str) -> dict[str, bytes]:
    sha = manifest["sha256"]
    local = cache / "tokens" / f"{sha}.json"
    data = None
    if str(local) not in _PARSED and not local.exists():
        data = store.get(manifest["bundle"])
        if hashlib.sha256(data).hexdigest() != sha:
            raise SegmentDamaged(f"{manifest['bundle']} in {store.url} is not the bundle its manifest names")
        local.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(local, data)
    files = _parsed(local, data)["rollouts"].get(rollout_id) or {}
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


#: Manifests and token bundles parsed in this process, by their cache path (they never change): a
#: consumer rebuilds the view for each take's rollouts, and parsing them again each time was most
#: of a take from a store (benchmarks/bench_handoff.py).
_PARSED: dict[str, Any] = {}
_PARSED_MAX = 4096


def _parsed(local: Path, data: Optional[bytes] = None) -> Any:
    key = str(local)
    found = _PARSED.get(key)
    if found is None:
        found = orjson.loads(local.read_bytes() if data is None else data)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = found
    return found


def _manifest(store: ObjectStore, cache: Path, name: str) -> dict[str, Any]:
    local = cache / name
    if str(local) in _PARSED or local.exists():
        return _parsed(local)
    data = store.get(name)
    local.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(local, data)
    return _parsed(local, data)


def _segment(store: ObjectStore, cache: Path, manifest: dict[str, Any]) -> bytes:
    sha = manifest["sha256"]
    local = cache / "segments" / f"{sha}.jsonl"
    if local.exists():
        return local.read_bytes()
    data = _fetch_segment(store, manifest["segment"], sha)
    local.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(local, data)
    return data


def _fetch_segment(store: ObjectStore, name: str, sha256: str) -> bytes:
    """The segment's bytes, checked against the sha256 its manifest names."""
    data = store.get(name)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SegmentDamaged(f"{name} in {store.url} is not the segment its manifest names (sha256 {sha256})")
    return data


def _rebuild(store: ObjectStore, cache: Path, target: Path, manifests: list[dict[str, Any]], rollouts: set[str]) -> None:
    """Rewrite the files of ``rollouts`` from every segment that names them, in the stated order,
    by the ``completed_at`` the manifests give (as `plan_segment_reads` places them)."""
    if not rollouts:
        return
    seen: set[str] = set()
    # writer -> rollout -> (its lines, their completed_at), each writer's in sequence order.
    by_writer: dict[str, dict[str, tuple[list[bytes], list[Any]]]] = {}
    ordered = sorted(manifests, key=lambda m: (m["writer"], m["sequence"]))
    for manifest in ordered:
        if manifest["sha256"] in seen or not rollouts.intersection(manifest.get("rollouts") or ()):
            continue
        seen.add(manifest["sha256"])
        found: dict[str, tuple[list[bytes], list[Any]]] = {}
        for rollout_id, line, parsed in whole_segment_lines(_segment(store, cache, manifest)):
            if rollout_id in rollouts:
                lines, values = found.setdefault(rollout_id, ([], []))
                lines.append(line)
                values.append(parsed.get("completed_at"))
        order = manifest.get("completed_at") or {}
        per_rollout = by_writer.setdefault(manifest["writer"], {})
        for rollout_id, (lines, values) in found.items():
            kept = order.get(rollout_id)
            lines_so_far, values_so_far = per_rollout.setdefault(rollout_id, ([], []))
            lines_so_far += lines
            values_so_far += kept if kept is not None and len(kept) == len(lines) else values
    for rollout_id in rollouts:
        streams = [per_rollout[rollout_id] for _, per_rollout in sorted(by_writer.items()) if rollout_id in per_rollout]
        merged = merge_order([values for _, values in streams])
        _write_atomically(target / f"{rollout_id}{CAPTURE_SUFFIX}",
                          b"".join(streams[stream][0][position] + b"\n" for stream, position in merged), durable=False)


class SegmentRead:
    """One segment of a store as a read task takes it: where it is, what it must hash to, and the
    call index in its rollout of each of its lines (``indexes[rollout_id]``: the list, in append
    order, or the first when they run on by one, as they do for a rollout one writer wrote), worked
    out from every manifest (`plan_segment_reads`), so the task reads this segment alone."""

    __slots__ = ("url", "segment", "sha256", "size", "indexes", "incomplete")

    def __init__(self, url: str, segment: str, sha256: str, size: int) -> None:
        self.url, self.segment, self.sha256, self.size = url, segment, sha256, size
        self.indexes: dict[str, Union[int, list[int]]] = {}
        #: Its rollouts with a lost line (an ``incomplete/`` marker).
        self.incomplete: set[str] = set()

    def __getstate__(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(self.__slots__, state):
            setattr(self, name, value)

    def lines(self) -> Iterator[tuple[str, int, dict[str, Any]]]:
        """``(rollout_id, call_index, parsed line)`` of each whole line, fetched and checked."""
        data = _fetch_segment(ObjectStore(self.url), self.segment, self.sha256)
        taken: dict[str, int] = {}
        for rollout_id, _, parsed in whole_segment_lines(data):
            indexes = self.indexes.get(rollout_id)
            if indexes is None:
                continue
            position = taken.get(rollout_id, 0)
            taken[rollout_id] = position + 1
            yield rollout_id, indexes + position if isinstance(indexes, int) else indexes[position], parsed


def plan_segment_reads(url: str) -> Optional[list[SegmentRead]]:
    """Every segment the store's manifests name, once each (by sha256), with each line's call index
    in its rollout: the order `store_view` writes a rollout's file in, worked out from the
    manifests' ``completed_at`` without reading a segment. None when a manifest has no
    ``completed_at`` (written before it was kept): then rollouts are read whole."""
    store = ObjectStore(url)
    cache = cache_root() / hashlib.sha1(store.url.encode()).hexdigest()[:16]
    manifests = [_manifest(store, cache, name) for name in store.names(MANIFESTS)]
    reads: list[tuple[str, SegmentRead, dict[str, list[Any]]]] = []  # (writer, read, its order)
    seen: set[str] = set()
    for manifest in sorted(manifests, key=lambda m: (m["writer"], m["sequence"])):
        order = manifest.get("completed_at")
        if order is None:
            return None
        if manifest["sha256"] not in seen:
            seen.add(manifest["sha256"])
            read = SegmentRead(store.url, manifest["segment"], manifest["sha256"], int(manifest.get("bytes", 0)))
            reads.append((manifest["writer"], read, order))
    # Most rollouts have one writer: their lines are numbered in its order, segment after segment.
    # Those that several wrote are merged by completed_at (`merge_order`), as the view merges them.
    writer_of: dict[str, str] = {}
    several: set[str] = set()
    for writer, _, order in reads:
        for rollout_id in order:
            if writer_of.setdefault(rollout_id, writer) != writer:
                several.add(rollout_id)
    following: dict[str, int] = {}
    streams: dict[str, dict[str, list[tuple[SegmentRead, list[Any]]]]] = {}
    for writer, read, order in reads:
        indexes = read.indexes
        for rollout_id, values in order.items():
            if rollout_id in several:
                streams.setdefault(rollout_id, {}).setdefault(writer, []).append((read, values))
            else:
                first = indexes[rollout_id] = following.get(rollout_id, 0)
                following[rollout_id] = first + len(values)
    for rollout_id, by_writer in streams.items():
        writers = [by_writer[writer] for writer in sorted(by_writer)]
        places = [[(read, k) for read, piece in pieces for k in range(len(piece))] for pieces in writers]
        numbered: dict[int, list[int]] = {}  # By id(read): the list each read's indexes[rollout_id] is.
        for pieces in writers:
            for read, piece in pieces:
                read.indexes[rollout_id] = numbered[id(read)] = [0] * len(piece)
        merged = merge_order([[value for _, piece in pieces for value in piece] for pieces in writers])
        for call_index, (stream, position) in enumerate(merged):
            read, k = places[stream][position]
            numbered[id(read)][k] = call_index
        for pieces in writers:  # Lines that run on by one in a segment: its first says it.
            for read, _ in pieces:
                found = numbered[id(read)]
                if found == list(range(found[0], found[0] + len(found))):
                    read.indexes[rollout_id] = found[0]
    incomplete = {marker.rpartition("/")[2] for marker in store.names(INCOMPLETE_OBJECTS)}
    if incomplete:
        for _, read, order in reads:
            read.incomplete = incomplete.intersection(order)
    return [read for _, read, _ in reads]


def _write_atomically(path: Path, data: bytes, durable: bool = True) -> None:
    """Whole under a temporary name, then renamed: no reader sees part of it. ``durable=False``: a
    view's rollout file, made durable by the one barrier before the applied list (`_barrier`)."""
    if not durable:
        try:  # A view's file rebuilt as it was (a consumer rebuilds its takes'): left alone, no rename.
            if path.stat().st_size == len(data) and path.read_bytes() == data:
                return
        except FileNotFoundError:
            pass
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
    with open(temporary, "wb") as handle:
        handle.write(data)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(temporary, path)


def _barrier(directory: Path) -> None:
    """Every view file written before this is durable: one barrier for the rebuild (it writes
    hundreds of files; an fsync each cost 1 ms apiece)."""
    from ..contract.reading import sync_filesystem

    sync_filesystem(str(directory))


__all__ = ["INCOMPLETE_OBJECTS", "MANIFESTS", "SEGMENT_OBJECTS", "SegmentDamaged", "SegmentRead", "merge_order",
           "plan_segment_reads", "segment_order", "whole_segment_lines", "TOKEN_FILE_SUFFIXES",
           "TOKEN_MANIFESTS", "TOKEN_OBJECTS", "compact_store", "incomplete_name", "manifest_name", "store_rollout_sizes",
           "token_bundle_name", "token_manifest_name", "merge_writers", "segment_name",
           "store_view"]
