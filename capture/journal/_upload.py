"""The uploader (docs/files.md): sealed segments from the spool to the store, each named by its content,
its manifest written after it.

One thread, in a process of its own beside the sidecar (`_upload_process`). For each sealed segment in the spool (oldest first: those a restart
found go before the new ones), in this order, each step safe to repeat after a crash at any
point: put the segment as ``segments/<writer_id>/<sha256>.jsonl`` (the same bytes again: the same
object); put its manifest ``manifests/<writer_id>/<sequence>.json`` (the same, again); remove it
from the spool. A reader reads only what a manifest names, so it never sees a segment that is not
whole, and takes each sha256 once.

A store that refuses (down, no credentials, a full bucket) never fails a call: the segments stay
in the spool, the uploader tries again with a growing pause, the log says so (once a minute at
most), and the lag -- bytes, segments, and the age of the oldest unsent one -- is in the metrics
and ``/-/ready``'s body.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import logging
import os
import threading
import time
from typing import Any, Optional

import orjson

from records.contract import (
    INCOMPLETE_SUFFIX, ObjectStore, START_INDEX, TOKEN_FILE_SUFFIXES, expert_object_name, incomplete_name,
    manifest_name, read_in_flight, segment_name, segment_order, token_bundle_name, token_manifest_name,
)
from records.contract.writing import EXPERTS_SUFFIX, SILENT_SECONDS, add_to_store_index, rollout_marker_name

from ._segments import ROLLOUTS_SUFFIX, SEALED_SUFFIX, read_rollouts_index, sealed_segments
from ._watermark import Watermark, spool_id

log = logging.getLogger("mcc.capture")
#: Pauses after a refused upload, growing to the last.
_BACKOFF_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
#: How long a round waits for its sidecar's publication of calls in flight to be newer than its
#: listing of the ends (a live sidecar publishes every 0.1 s).
_FRESH_PUBLICATION_WAIT = 0.3
#: Rollout markers remembered as put (older ones are put again: an empty object).
_MARKED_REMEMBERED = 200_000
#: The lag past which the log says so (once a minute).
LAG_WARN_SECONDS = 300.0


class UploadLag:
    """What is sealed and not yet in the store."""

    __slots__ = ("bytes", "segments", "oldest_seconds")

    def __init__(self, bytes_: int = 0, segments: int = 0, oldest_seconds: float = 0.0) -> None:
        self.bytes = bytes_
        self.segments = segments
        self.oldest_seconds = oldest_seconds

    def as_dict(self) -> dict[str, float]:
        return {"bytes": self.bytes, "segments": self.segments, "oldest_seconds": round(self.oldest_seconds, 3)}


def spool_lag(spool_dir: str) -> UploadLag:
    """What the spool holds sealed and not yet in the store (read from the spool alone)."""
    segments = sealed_segments(spool_dir)
    now, total, oldest = time.time(), 0, 0.0
    for path in segments:
        try:
            status = os.stat(path)
        except FileNotFoundError:
            continue
        total += status.st_size
        oldest = max(oldest, now - status.st_mtime)
    return UploadLag(total, len(segments), oldest)


class Uploader:
    """Uploads the spool's sealed segments to ``store_url`` on a thread of its own."""

    def __init__(self, spool_dir: str, store_url: str, interval: float = 0.5, token_idle: float = 60.0,
                 hand_off: bool = True) -> None:
        self.spool_dir = spool_dir
        #: A rollout's training-token files go once unchanged this long (and at the drain).
        self._token_idle = token_idle
        #: What was shipped of each rollout's token files (their sizes, times, inodes).
        self._tokens_shipped: dict[str, tuple[Any, ...]] = {}
        #: Routed-expert objects already in the store, by sha256 (`_ship_routed_experts`).
        self._experts_shipped: set[str] = set()
        #: The rollouts whose marker (``rollouts/<rollout_id>``) this uploader has put.
        self._marked: set[str] = set()
        self.store = ObjectStore(store_url)
        self._interval = interval
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.uploaded = 0
        self.failures = 0
        self.problem: Optional[str] = None
        self._said_at = 0.0
        self._markers_sent: set[str] = set()
        self._hand_off = hand_off
        self._watermark: Optional[Watermark] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mcc-uploader", daemon=True)
        self._thread.start()

    def lag(self) -> UploadLag:
        return spool_lag(self.spool_dir)

    def stop(self, timeout: float) -> bool:
        """Upload what is sealed (within ``timeout`` seconds), then stop; whether nothing is left."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not sealed_segments(self.spool_dir):
                break
            self._wake.set()
            time.sleep(0.05)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()) + 1.0)
        try:
            self.ship_tokens(everything=True)  # What the rollouts' token files hold now, all of it.
        except Exception as exc:
            log.warning("cannot upload the training-token files to %s at exit: %s: %s; they stay in the spool %s",
                        self.store.url, type(exc).__name__, exc, self.spool_dir)
        left = sealed_segments(self.spool_dir)
        if self.watermark is not None:
            try:  # Drained whole: it holds nothing any more (a consumer waits for it no longer).
                self.watermark.follow_ends()
                self.watermark.holding = self.watermark.ended(
                    self.watermark.in_open_segments() | self.watermark.in_sealed_segments(left)
                    | set(self._tokens_changed()))
                self.watermark.publish(stopped=not left and not self.watermark.in_open_segments()
                                       and not self._tokens_changed())
            except Exception as exc:
                log.warning("cannot put this spool's watermark in %s at exit: %s: %s", self.store.url,
                            type(exc).__name__, exc)
        if left:
            log.warning("%d sealed segment(s) not uploaded to %s at exit: they stay in the spool %s and go first "
                        "when a sidecar starts on it again", len(left), self.store.url, self.spool_dir)
        return not left

    @property
    def watermark(self) -> Optional[Watermark]:
        """The live hand-off's watermark of this spool (`hand_off_round`); None: uploads only.
        Made on first use: the spool (and its id) may not exist before the first segment."""
        if self._watermark is None and self._hand_off and os.path.isdir(self.spool_dir):
            self._watermark = Watermark(self.spool_dir, self.store, self.spool_id)
        return self._watermark

    def hand_off_round(self) -> int:
        """One round with the live hand-off's watermark (`capture.journal._watermark`): the store's
        ends followed, the ended rollouts this spool holds sealed and shipped at once, then what
        is sealed uploaded as ever, then the watermark object put. How many segments went."""
        watermark = self.watermark
        assert watermark is not None
        watermark.follow_ends()
        if watermark.ended(watermark.in_open_segments()):
            watermark.seal_open_segments()
        changed = self._tokens_changed()  # Once a round: the files listed and stat'ed once.
        sent = self.upload_all(ship_now=watermark.ended(set(changed)), changed=changed)
        unshipped = {rollout_id for rollout_id, stamped in changed.items()
                     if self._tokens_shipped.get(rollout_id) != stamped[:-1]}
        pending = watermark.in_open_segments() | watermark.in_sealed_segments(sealed_segments(self.spool_dir)) \
            | self._in_flight_here(watermark.watermark)
        watermark.holding = watermark.ended(pending | unshipped)
        watermark.pending = pending  # Every rollout with lines or a call here not in the store yet: an end finds it.
        watermark.publish()
        return sent

    def _in_flight_here(self, since: float) -> set[str]:
        """The rollouts this spool's sidecar processes have a call of in flight (they publish them:
        `records.contract._calls_in_flight`), as each published after ``since`` (the round's listing
        of the ends; waited for a moment): a call in flight at its rollout's end holds the rollout
        as its lines would, until its line is in the spool (docs/reading.md, "One write barrier")."""
        deadline = time.monotonic() + _FRESH_PUBLICATION_WAIT
        while True:
            now = time.time()
            live = [record for record in read_in_flight(self.spool_dir) if now - record["at"] < SILENT_SECONDS]
            if all(record["at"] >= since for record in live) or time.monotonic() >= deadline:
                return {rollout_id for record in live for rollout_id in record["rollouts"]}
            time.sleep(0.02)

    def upload_all(self, ship_now: Optional[set[str]] = None,
                   changed: Optional[dict[str, tuple[Any, ...]]] = None) -> int:
        """Upload every sealed segment now (on the calling thread), and the spool's new
        ``.capture.incomplete`` markers (a line lost: the store's readers must know it too), and
        the token files due (those of ``ship_now`` at once); how many segments went."""
        sent = 0
        for path in sealed_segments(self.spool_dir):
            self.upload(path)
            sent += 1
        for name in os.listdir(self.spool_dir):
            if name.endswith(INCOMPLETE_SUFFIX) and name not in self._markers_sent:
                self.store.put(incomplete_name(name[: -len(INCOMPLETE_SUFFIX)]), b"")
                self._markers_sent.add(name)
        self.ship_tokens(now_for=ship_now, changed=changed)
        return sent

    def _tokens_changed(self) -> dict[str, tuple[Any, ...]]:
        """The rollouts whose token files changed since they were shipped, with their fingerprints
        and the time of their newest change (last)."""
        changed = {}
        for rollout_id, files in _token_files(self.spool_dir).items():
            fingerprint = tuple(sorted((suffix, s.st_size, s.st_mtime_ns, s.st_ino) for suffix, s in files.items()))
            if fingerprint != self._tokens_shipped.get(rollout_id):
                changed[rollout_id] = (*fingerprint, max(s.st_mtime for s in files.values()))
        return changed

    def ship_tokens(self, everything: bool = False, now_for: Optional[set[str]] = None,
                    changed: Optional[dict[str, tuple[Any, ...]]] = None) -> int:
        """The training-token files (docs/tokens.md) of the rollouts whose files changed and have been
        still for ``token_idle`` seconds (``everything``: all that changed, the drain's), as one
        bundle: each rollout's files whole, read under its shared lock (a consistent snapshot), the
        bundle named by its content, then its manifest. Readers take each rollout's latest; those
        of ``now_for`` (ended rollouts a consumer waits for) go whatever their age; ``changed``:
        the round's `_tokens_changed`, when it has it. How many rollouts went."""
        now, due = time.time(), {}
        for rollout_id, stamped in (self._tokens_changed() if changed is None else changed).items():
            fingerprint, newest = stamped[:-1], stamped[-1]
            if everything or now - newest >= self._token_idle or (now_for is not None and rollout_id in now_for):
                due[rollout_id] = fingerprint
        if not due:
            return 0
        for rollout_id in sorted(due):  # Before the bundle that names them.
            self._ship_routed_experts(rollout_id)
        bundle = {rollout_id: _snapshot(self.spool_dir, rollout_id) for rollout_id in sorted(due)}
        data = orjson.dumps({"spool": self.spool_id, "rollouts": bundle})
        sha = hashlib.sha256(data).hexdigest()
        name = token_bundle_name(self.spool_id, sha)
        self.store.put(name, data)
        self.store.put(token_manifest_name(self.spool_id, time.time_ns(), sha), orjson.dumps(
            {"spool": self.spool_id, "bundle": name, "sha256": sha, "rollouts": sorted(due)}))
        self._tokens_shipped.update(due)
        return len(due)

    def _ship_routed_experts(self, rollout_id: str) -> None:
        """The rollout's routed-expert objects (``--capture-routed-experts``), each named by its
        sha256 (``experts/<sha256>.npy``, shared by every rollout): the same rows go once."""
        directory = os.path.join(self.spool_dir, rollout_id + EXPERTS_SUFFIX)
        try:
            names = sorted(name for name in os.listdir(directory) if name.endswith(".npy"))
        except FileNotFoundError:
            return
        for name in names:
            sha256 = name[:-len(".npy")]
            if sha256 in self._experts_shipped:
                continue
            with open(os.path.join(directory, name), "rb") as handle:
                self.store.put(expert_object_name(sha256), handle.read())
            self._experts_shipped.add(sha256)

    @property
    def spool_id(self) -> str:
        """This spool's own id (`spool_id`)."""
        return spool_id(self.spool_dir)

    def upload(self, path: str) -> None:
        """One sealed segment: the object, then its manifest, then out of the spool."""
        writer_id = os.path.basename(os.path.dirname(path))
        sequence = int(os.path.basename(path)[: -len(SEALED_SUFFIX)])
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:  # Another worker of this spool (--workers) uploaded it first.
            return
        sha = hashlib.sha256(data).hexdigest()
        index = path[: -len(SEALED_SUFFIX)] + ROLLOUTS_SUFFIX
        order = None
        try:
            with open(index, "rb") as handle:  # Written by the writer as it sealed.
                rollouts, order = read_rollouts_index(handle.read())
        except FileNotFoundError:  # A segment a crash left open, sealed by the next start: read it.
            rollouts = sorted({line.partition(b"\t")[0].decode() for line in data.split(b"\n") if b"\t" in line})
        if order is None:  # Its whole lines, as every reader takes them (the torn tail of a crash, a part-write).
            order = segment_order(data)
        name = segment_name(writer_id, sha)
        for rollout_id in rollouts:  # Its marker first: an end finds the rollout at one request.
            if rollout_id not in self._marked:
                self.store.put(rollout_marker_name(rollout_id), b"")
                # Its entry in the start index: a rollout with calls and no end is found from there.
                add_to_store_index(self.store, START_INDEX, time.time(), rollout_id)
                if len(self._marked) >= _MARKED_REMEMBERED:
                    self._marked.clear()  # Put again at worst: an empty object, idempotent.
                self._marked.add(rollout_id)
        self.store.put(name, data)
        # Each rollout's lines' completed_at: readers place every line of this segment in its rollout
        # from the manifests alone (records.store.plan_segment_reads: a read task per segment), by them.
        manifest = {"writer": writer_id, "sequence": sequence, "segment": name, "sha256": sha, "bytes": len(data),
                    "lines": data.count(b"\n"), "rollouts": rollouts, "completed_at": order}
        self.store.put(manifest_name(writer_id, sequence), orjson.dumps(manifest))
        for done in (path, index):
            try:
                os.unlink(done)
            except FileNotFoundError:  # The other worker's upload of it got there first: the same objects.
                pass
        self.uploaded += 1

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self.hand_off_round() if self.watermark is not None else self.upload_all()
                failures, self.problem = 0, None
            except Exception as exc:  # The store's refusal is the store's: the spool keeps the lines.
                self.failures += 1
                failures += 1
                self.problem = f"{type(exc).__name__}: {exc}"[:500]
                self._say(f"cannot upload to {self.store.url}: {self.problem}; the segments stay in the spool "
                          f"{self.spool_dir} and are tried again")
            if self._stop.is_set():
                break
            lag = self.lag()
            if lag.oldest_seconds > LAG_WARN_SECONDS:
                self._say(f"upload lag: {lag.segments} segment(s), {lag.bytes} bytes, the oldest sealed "
                          f"{lag.oldest_seconds:.0f} s ago, not yet in {self.store.url}")
            pause = _BACKOFF_SECONDS[min(failures, len(_BACKOFF_SECONDS)) - 1] if failures else self._interval
            self._wake.wait(pause)
            self._wake.clear()

    def _say(self, message: str) -> None:
        now = time.monotonic()
        if now - self._said_at >= 60.0:
            self._said_at = now
            log.warning("%s", message)


def _token_files(spool_dir: str) -> dict[str, dict[str, os.stat_result]]:
    """Each rollout's training-token files in the spool, by suffix, with their stat."""
    found: dict[str, dict[str, os.stat_result]] = {}
    for name in os.listdir(spool_dir):
        for suffix in TOKEN_FILE_SUFFIXES:
            if name.endswith(suffix):
                try:
                    found.setdefault(name[: -len(suffix)], {})[suffix] = os.stat(os.path.join(spool_dir, name))
                except FileNotFoundError:
                    pass
                break
    return found


def _snapshot(spool_dir: str, rollout_id: str) -> dict[str, str]:
    """The rollout's token files, whole, under its shared lock (as Gym's readers take them)."""
    lock = os.open(os.path.join(spool_dir, rollout_id + ".tokens.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
        files = {}
        for suffix in TOKEN_FILE_SUFFIXES:
            try:
                with open(os.path.join(spool_dir, rollout_id + suffix), "rb") as handle:
                    files[suffix] = base64.b64encode(handle.read()).decode()
            except FileNotFoundError:
                pass
        return files
    finally:
        os.close(lock)


__all__ = ["LAG_WARN_SECONDS", "UploadLag", "Uploader", "spool_lag"]
