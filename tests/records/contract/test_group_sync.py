"""`records.GroupSync` (issue 34): the token files' intents and entries, written by many threads at
once, made durable together -- each writer returns only after a barrier that began after its write."""

from __future__ import annotations

import itertools
import os
import threading
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
        #: The threads that ran a barrier.
        self.threads: set[int] = set()

    def _barrier(self, batch: list[str]):  # type: ignore[override]
        began = next(self.clock)
        self.threads.add(threading.get_ident())
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


def test_after_durable_tells_each_caller_after_a_barrier_that_began_after_its_write_holding_no_thread(tmp_path):
    """The event loop's form (issue 76): the caller hands over its file and goes on (it never runs a
    barrier); it is told on the barrier's thread, after a barrier that began after the call --
    shared with the others waiting then, and with threads in `wait_durable` at the same time."""
    sync = Recorded(str(tmp_path))
    told: list[tuple[str, int, int, object]] = []
    all_told = threading.Event()

    def tell(path: str, called: int):
        def done(failure):
            told.append((path, called, next(sync.clock), failure))
            if len(told) == 48:
                all_told.set()
        return done

    def thread_writer(number: int) -> None:
        path = str(tmp_path / f"t{number % 4}.tokens.jsonl")
        _write(path, b"{}\n")
        sync.wait_durable(path)

    with ThreadPoolExecutor(4) as pool:
        waiting = [pool.submit(thread_writer, number) for number in range(8)]
        for number in range(48):
            path = str(tmp_path / f"r{number % 8}.tokens.intents")
            _write(path, f"call-{number}\n".encode())
            called = next(sync.clock)
            sync.after_durable(path, tell(path, called))
            if number % 6 == 0:
                time.sleep(0.004)
        for future in waiting:
            future.result()
    assert all_told.wait(10), f"{len(told)} of 48 told"
    assert threading.get_ident() not in sync.threads, "a caller of after_durable ran a barrier"
    for path, called, back, failure in told:
        assert failure is None
        assert any(path in batch and called < began and ended < back for began, ended, batch in sync.barriers), path
    assert len(sync.barriers) < 48, "callers waiting at once share a barrier"


def test_after_durable_tells_a_failed_barrier_to_its_callers_and_goes_on(tmp_path):
    poison = str(tmp_path / "poison.tokens.intents")
    sync = GroupSync(str(tmp_path))
    real = sync._barrier
    sync._barrier = lambda batch: OSError(5, "injected") if poison in batch else real(batch)  # type: ignore[method-assign]
    outcomes: dict[str, object] = {}
    done = threading.Event()

    def tell(path: str):
        def told(failure):
            outcomes[path] = failure
            if len(outcomes) == 2:
                done.set()
        return told

    _write(poison, b"call\n")
    sync.after_durable(poison, tell(poison))
    assert done.wait(0) is False
    clean = str(tmp_path / "clean.tokens.intents")
    for _ in range(200):  # The poisoned barrier first, then a clean one.
        if poison in outcomes:
            break
        time.sleep(0.005)
    _write(clean, b"call\n")
    sync.after_durable(clean, tell(clean))
    assert done.wait(10)
    assert isinstance(outcomes[poison], OSError) and outcomes[poison].errno == 5
    assert outcomes[clean] is None


@pytest.mark.parametrize("way", ["wait_durable", "after_durable"])
def test_without_syncfs_each_file_is_fsynced(tmp_path, monkeypatch, way):
    sync = GroupSync(str(tmp_path))
    sync._syncfs = None
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
    path = str(tmp_path / "r.tokens.intents")
    _write(path, b"call\n")
    if way == "wait_durable":
        sync.wait_durable(path)
    else:
        told = threading.Event()
        sync.after_durable(path, lambda failure: told.set() if failure is None else None)
        assert told.wait(10)
    assert synced == [path]
