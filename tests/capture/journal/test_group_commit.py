"""Group commit (docs/files.md, issue 5): lines of many calls made durable by one barrier per batch,
with the appender's contract line by line and failures that stay with their own lines."""

from __future__ import annotations

import gc
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from capture.journal import GroupCommitter
from records import CaptureStore
from records.contract import encode_capture_line


class Outcomes:
    """Collects each line's (size, outcome); `wait` until `count` lines are settled."""

    def __init__(self) -> None:
        self.settled: dict[str, tuple[int, object]] = {}
        self.condition = threading.Condition()

    def callback(self, key: str):
        def done(size: int, outcome: object) -> None:
            with self.condition:
                assert key not in self.settled, f"{key} settled twice"
                self.settled[key] = (size, outcome)
                self.condition.notify_all()
        return done

    def wait(self, count: int) -> None:
        with self.condition:
            assert self.condition.wait_for(lambda: len(self.settled) >= count, timeout=30)


def _line(call_id: str, padding: int = 10) -> bytes:
    return encode_capture_line({"model_call_id": call_id, "request": {"p": "x" * padding}})


@pytest.mark.parametrize("max_open_files", [None, 3])
@pytest.mark.parametrize("sync_mode", ["auto", "fsync"])
def test_lines_from_many_threads_to_many_files_are_each_written_once_and_settled_after_the_barrier(tmp_path, sync_mode,
                                                                                                   max_open_files):
    """16 threads queue 400 lines over 20 files (some above 64 KiB): every line intact, in its own
    file, none lost or doubled, each settled once with the barrier's seconds and its size. With 3
    files kept open, descriptors leave the cache while barriers still use them; none leaks."""
    gc.collect()  # Descriptors earlier tests left to the collector must not close during the count.
    descriptors_before = len(os.listdir("/proc/self/fd"))
    committer = GroupCommitter(sync_mode, directory=str(tmp_path), max_open_files=max_open_files)
    outcomes = Outcomes()

    def submit(number: int) -> None:
        line = _line(str(number), 100_000 if number % 50 == 0 else 10)
        committer.submit(str(tmp_path / f"r{number % 20}.capture.jsonl"), lambda: line, outcomes.callback(str(number)))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(submit, range(400)))
    outcomes.wait(400)
    committer.close()
    assert len(os.listdir("/proc/self/fd")) == descriptors_before
    assert all(isinstance(outcome, float) and outcome >= 0 and size > 0 for size, outcome in outcomes.settled.values())
    store = CaptureStore(str(tmp_path))
    for rollout in range(20):
        result = store.read_available(f"r{rollout}")
        assert result.malformed == 0 and not result.torn_last_line
        assert sorted(int(line["model_call_id"]) for line in result.lines) == list(range(rollout, 400, 20))


def test_a_failing_file_or_line_fails_alone(tmp_path):
    """A line whose directory is gone and a line that cannot be built fail with their own errors;
    the lines of the same batch for other files are written."""
    committer = GroupCommitter()
    outcomes = Outcomes()
    gate = threading.Event()
    # Hold the writer thread in a first line's serialisation so the next three land in one batch.
    committer.submit(str(tmp_path / "first.capture.jsonl"), lambda: gate.wait() and _line("first"), outcomes.callback("first"))
    committer.submit(str(tmp_path / "gone" / "r.capture.jsonl"), lambda: _line("lost"), outcomes.callback("missing dir"))
    committer.submit(str(tmp_path / "ok.capture.jsonl"), lambda: _line("ok"), outcomes.callback("ok"))

    def cannot_build() -> bytes:
        raise ValueError("not serialisable")

    committer.submit(str(tmp_path / "ok.capture.jsonl"), cannot_build, outcomes.callback("unbuildable"))
    gate.set()
    outcomes.wait(4)
    committer.close()
    assert isinstance(outcomes.settled["missing dir"][1], FileNotFoundError)
    assert isinstance(outcomes.settled["unbuildable"][1], ValueError)
    assert isinstance(outcomes.settled["ok"][1], float) and isinstance(outcomes.settled["first"][1], float)
    assert [line["model_call_id"] for line in CaptureStore(str(tmp_path)).read("ok")] == ["ok"]


def test_a_torn_last_line_is_terminated_before_the_batch_is_appended(tmp_path):
    path = tmp_path / "r.capture.jsonl"
    path.write_bytes(b'{"model_call_id": "ok"}\n{"model_call_id": "to')
    committer = GroupCommitter()
    outcomes = Outcomes()
    for call_id in ("a", "b"):
        committer.submit(str(path), lambda call_id=call_id: _line(call_id), outcomes.callback(call_id))
    outcomes.wait(2)
    committer.close()
    result = CaptureStore(str(tmp_path)).read_available("r")
    assert [line["model_call_id"] for line in result.lines] == ["ok", "a", "b"]
    assert result.malformed_indexes == [1]


def test_close_writes_what_is_queued_and_refuses_more(tmp_path):
    committer = GroupCommitter()
    outcomes = Outcomes()
    for number in range(50):
        committer.submit(str(tmp_path / "r.capture.jsonl"), lambda number=number: _line(str(number)), outcomes.callback(str(number)))
    committer.close()
    assert len(outcomes.settled) == 50 and len(CaptureStore(str(tmp_path)).read("r")) == 50
    with pytest.raises(RuntimeError):
        committer.submit(str(tmp_path / "r.capture.jsonl"), lambda: _line("late"), outcomes.callback("late"))


def _append_and_wait(committer: GroupCommitter, path, call_id: str, outcomes: Outcomes) -> None:
    committer.submit(str(path), lambda: _line(call_id), outcomes.callback(call_id))
    outcomes.wait(len(outcomes.settled) + 1)


def test_a_file_kept_open_that_a_collector_clears_is_started_again(tmp_path):
    """`clear_model_call_captures` unlinks the file between two calls of a redispatched rollout:
    the next line goes to a new file at the same path, not to the removed one."""
    from records import clear_model_call_captures

    committer = GroupCommitter(directory=str(tmp_path))
    outcomes = Outcomes()
    _append_and_wait(committer, tmp_path / "r.capture.jsonl", "before", outcomes)
    clear_model_call_captures(["r"], str(tmp_path))
    _append_and_wait(committer, tmp_path / "r.capture.jsonl", "after", outcomes)
    _append_and_wait(committer, tmp_path / "r.capture.jsonl", "again", outcomes)
    committer.close()
    assert [line["model_call_id"] for line in CaptureStore(str(tmp_path)).read("r")] == ["after", "again"]


def test_a_file_kept_open_notices_a_torn_line_another_writer_left(tmp_path):
    """Another process appended a torn line after this writer's last append: the size is not the
    one this writer left, so the last byte is checked and the torn line terminated."""
    path = tmp_path / "r.capture.jsonl"
    committer = GroupCommitter(directory=str(tmp_path))
    outcomes = Outcomes()
    _append_and_wait(committer, path, "first", outcomes)
    with open(path, "ab") as other_writer:
        other_writer.write(b'{"model_call_id": "cra')
    _append_and_wait(committer, path, "second", outcomes)
    committer.close()
    result = CaptureStore(str(tmp_path)).read_available("r")
    assert [line["model_call_id"] for line in result.lines] == ["first", "second"] and result.malformed_indexes == [1]


@pytest.mark.parametrize("keep_open", [True, False])
def test_open_files_are_reused_only_where_that_is_safe_and_closed_when_released(tmp_path, keep_open):
    from capture.journal._open_files import OpenFiles

    files = OpenFiles(keep_open, capacity=2)
    first, created = files.append(str(tmp_path / "a.capture.jsonl"), b"1\n")
    again, created_again = files.append(str(tmp_path / "a.capture.jsonl"), b"2\n")
    assert created and not created_again
    assert (again is first) is keep_open and len(files) == (1 if keep_open else 0)
    for name in "bcd":  # Past the capacity: "a" leaves the cache but stays open while held.
        files.release(files.append(str(tmp_path / f"{name}.capture.jsonl"), b"1\n")[0])
    assert len(files) == (2 if keep_open else 0)
    os.fstat(first.fd)  # Still open: two barriers hold it.
    files.release(first)
    files.release(again)
    with pytest.raises(OSError):
        os.fstat(first.fd)
    files.close_all()
    assert (tmp_path / "a.capture.jsonl").read_bytes() == b"1\n2\n"


MOUNTINFO = """22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:1 / / rw,relatime - ext4 /dev/vda rw
40 27 0:40 / /data rw,relatime - fuse.gcsfuse bucket rw
41 40 0:41 / /data/local\\040disk rw,relatime - xfs /dev/vdb rw
42 27 0:42 / /mnt/nfs rw,relatime - nfs4 server:/export rw
"""


@pytest.mark.parametrize("directory,fstype,syncfs", [
    ("/work/captures", "ext4", True),
    ("/data/captures", "fuse.gcsfuse", False),  # A FUSE daemon may answer syncfs without flushing.
    ("/data/local disk/captures", "xfs", True),  # The deeper mount wins; \\040 is a space.
    ("/mnt/nfs/captures", "nfs4", False),
    ("/mnt/nfsx", "ext4", True),  # A prefix of a name is not a parent directory.
])
def test_syncfs_is_used_only_on_filesystems_known_to_honour_it(directory, fstype, syncfs):
    from capture.journal._group_commit import filesystem_type, syncfs_flushes

    assert filesystem_type(directory, MOUNTINFO) == fstype
    assert syncfs_flushes(fstype) is syncfs


def test_an_unknown_sync_mode_is_refused():
    with pytest.raises(ValueError, match="sync_mode"):
        GroupCommitter("sometimes")


def test_new_files_are_created_with_the_appenders_mode(tmp_path):
    committer = GroupCommitter()
    outcomes = Outcomes()
    committer.submit(str(tmp_path / "r.capture.jsonl"), lambda: _line("a"), outcomes.callback("a"))
    outcomes.wait(1)
    committer.close()
    assert os.stat(tmp_path / "r.capture.jsonl").st_mode & 0o777 == 0o644 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("sync_mode", ["auto", "fsync"])
def test_a_lines_other_files_are_made_durable_by_its_barrier(tmp_path, monkeypatch, sync_mode):
    """The token capture mode's entry is written while its line is built and made durable by the
    line's barrier (issue 34): a syncfs of its filesystem, or an fsync of the file itself; the
    line is settled only after. A file that cannot be synced fails its line and is told."""
    import capture.journal._group_commit as group_commit

    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(group_commit.os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))[1])
    flushed: list[int] = []
    real_syncfs = group_commit._call_syncfs
    monkeypatch.setattr(group_commit, "_call_syncfs", lambda syncfs, fd: (flushed.append(fd), real_syncfs(syncfs, fd))[1])
    committer = GroupCommitter(sync_mode, directory=str(tmp_path))
    entry = tmp_path / "r.tokens.jsonl"
    told: list[BaseException] = []
    outcomes = Outcomes()

    def line_with_entry() -> tuple[bytes, tuple[list[str], object]]:
        entry.write_bytes(b'{"entry":1}\n')
        return _line("with-entry"), ([str(entry)], told.append)

    committer.submit(str(tmp_path / "r.capture.jsonl"), line_with_entry, outcomes.callback("with-entry"))
    outcomes.wait(1)
    if committer._syncfs is not None:
        assert flushed, "one flush covers the line and its entry"
    else:
        assert str(entry) in synced and str(tmp_path / "r.capture.jsonl") in synced
    assert isinstance(outcomes.settled["with-entry"][1], float) and not told

    missing = str(tmp_path / "gone" / "r.tokens.jsonl")
    committer.submit(str(tmp_path / "r.capture.jsonl"), lambda: (_line("lost-entry"), ([missing], told.append)),
                     outcomes.callback("lost-entry"))
    outcomes.wait(2)
    committer.close()
    assert isinstance(outcomes.settled["lost-entry"][1], OSError)
    assert len(told) == 1 and isinstance(told[0], OSError)
