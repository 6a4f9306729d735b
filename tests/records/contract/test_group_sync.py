"""`records.GroupSync` (issue 34): the token files' intents and entries, written by many threads at
once, made durable together -- each writer returns only after a barrier that began after its write."""

from __future__ import annotations

import itertools
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from records.contract.writing import GroupSync


class Recorded(GroupSync):
    """A GroupSync whose barriers are slow and noted (what each held, when it began and ended)."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        self.clock = itertools.count()
        self.barriers: list[tuple[int, int, set[str]]] = []

    def _barrier(self, batch: list[str]):  # type: ignore[override]
        began = next(self.clock)
        time.sleep(0.01)  # Long enough for the other threads to pile up behind it.
        failure = super()._barrier(batch)
        self.barriers.append((began, next(self.clock), set(batch)))
        return failure


def _write(path: str, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def test_each_writer_returns_after_a_barrier_that_began_after_its_write_and_barriers_are_shared(tmp_path):
    sync = Recorded(str(tmp_path))
    if sync._syncfs is None:
        pytest.skip("syncfs is not used on this filesystem: each file is fsynced on its own")
    returned: list[tuple[str, int, int]] = []

    def writer(number: int) -> None:
        path = str(tmp_path / f"r{number % 8}.tokens.intents")
        _write(path, f"call-{number}\n".encode())
        called = next(sync.clock)
        sync.wait_durable(path)
        returned.append((path, called, next(sync.clock)))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(writer, range(64)))
    assert len(returned) == 64
    for path, called, back in returned:
        assert any(path in batch and called < began and ended < back for began, ended, batch in sync.barriers), path
    assert len(sync.barriers) < 32, "writers waiting at once share a barrier"
    assert any(len(batch) > 1 for _, _, batch in sync.barriers)


def test_a_failed_barrier_fails_its_writers(tmp_path):
    """A barrier holding the poisoned file fails: every writer of that file hears it (its own
    barrier held its write); the next barrier is clean again."""
    poison = str(tmp_path / "poison.tokens.jsonl")
    sync = Recorded(str(tmp_path))
    if sync._syncfs is None:
        pytest.skip("syncfs is not used on this filesystem: each file is fsynced on its own")
    real = sync._barrier
    sync._barrier = lambda batch: OSError(5, "injected") if poison in batch else real(batch)  # type: ignore[method-assign]
    outcomes: list[tuple[str, bool]] = []

    def writer(number: int) -> None:
        path = poison if number % 5 == 0 else str(tmp_path / f"r{number % 4}.tokens.jsonl")
        _write(path, b"{}\n")
        try:
            sync.wait_durable(path)
            outcomes.append((path, False))
        except OSError as exc:
            assert exc.errno == 5
            outcomes.append((path, True))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(writer, range(40)))
    assert all(failed for path, failed in outcomes if path == poison)
    clean = str(tmp_path / "clean.tokens.jsonl")
    _write(clean, b"{}\n")
    sync.wait_durable(clean)  # Raises if the failure stuck.


def test_without_syncfs_each_file_is_fsynced(tmp_path, monkeypatch):
    sync = GroupSync(str(tmp_path))
    sync._syncfs = None
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
    path = str(tmp_path / "r.tokens.intents")
    _write(path, b"call\n")
    sync.wait_durable(path)
    assert synced == [path]
