"""Storage past one node (docs/files.md, issue 46): writer segments, a capture store, readers that merge
every writer, Gym's view by compaction. Real parts: sidecar processes (`mcc serve --stand-in`),
SIGKILL, a real S3 server on loopback (moto's standalone server, as s3fs's own tests use)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import socket
import subprocess
import sys

import aiohttp
import orjson
import pytest

from capture.journal import SegmentPolicy, Uploader, seal_leftovers, sealed_segments
from records import CaptureStore, read_model_call_records
from records.store import SegmentDamaged, compact_store, plan_segment_reads, store_view
from records.contract import manifest_name
from records.contract.reading import merge_writers

from tests import CHECKOUT, soak_or
from tests.processes import SidecarProcess


@pytest.fixture(autouse=True)
def _store_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "store-cache"))


def _line(call: int, completed_at: float) -> bytes:
    return orjson.dumps({"model_call_id": f"{call:032x}", "dialect": "chat", "model_ref": None, "started_at": 0,
                         "completed_at": completed_at, "latency_ms": 1, "latency_ttft_ms": None, "status_code": 200,
                         "error_category": None, "request": {"call": call}, "response": None})


def _write_segment(spool: str, writer: str, sequence: int, lines: list[tuple[str, bytes]]) -> str:
    directory = os.path.join(spool, "segments", writer)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{sequence:010d}.sealed")
    with open(path, "wb") as handle:
        handle.write(b"".join(rollout.encode() + b"\t" + line + b"\n" for rollout, line in lines))
    return path


def test_a_store_merges_writers_in_the_stated_order_and_reads_each_segment_once(tmp_path):
    """Per writer in append order, across writers by completed_at then writer id; a segment uploaded
    twice (a crash after its manifest, before it left the spool) is read once; a torn last line is
    skipped; Gym's per-rollout files are the lines' own bytes."""
    spool, url = str(tmp_path / "spool"), f"segments://{tmp_path}/store"
    a = [("r1", _line(1, 10.0)), ("r2", _line(2, 11.0)), ("r1", _line(3, 30.0))]
    b = [("r1", _line(4, 20.0)), ("r1", _line(5, 40.0))]
    first = _write_segment(spool, "host.1.aaaa", 1, a)
    with open(first, "rb") as handle:
        again = handle.read()
    _write_segment(spool, "host.2.bbbb", 1, b)
    uploader = Uploader(spool, url)
    assert uploader.upload_all() == 2 and sealed_segments(spool) == []
    with open(_write_segment(spool, "host.1.aaaa", 1, []), "wb") as handle:  # The same segment, again.
        handle.write(again)
    uploader.upload_all()
    torn = _write_segment(spool, "host.2.bbbb", 2, [("r1", _line(6, 50.0))])
    with open(torn, "ab") as handle:
        handle.write(b"r1\t{\"model_call_id\": \"tor")
    open(os.path.join(spool, "r2.capture.incomplete"), "wb").close()  # A line of r2 was lost.
    uploader.upload_all()
    assert CaptureStore(url).is_incomplete("r2") and not CaptureStore(url).is_incomplete("r1")
    calls = [record.request["call"] for record in read_model_call_records(url, "r1")]
    assert calls == [1, 4, 3, 5, 6]
    assert [record.request["call"] for record in read_model_call_records(url, "r2")] == [2]
    view = compact_store(url, str(tmp_path / "gym"))
    with open(os.path.join(view, "r1.capture.jsonl"), "rb") as handle:
        assert handle.read() == b"".join(line + b"\n" for line in (a[0][1], b[0][1], a[2][1], b[1][1], _line(6, 50.0)))
    assert sorted(os.listdir(view)) == [".applied-manifests", ".view-state.json", "r1.capture.jsonl", "r2.capture.incomplete",
                                        "r2.capture.jsonl"]


@pytest.mark.parametrize("seed", range(25))
def test_each_segment_read_alone_places_its_lines_as_the_view_does(tmp_path, seed):
    """`plan_segment_reads`: from the manifests alone, each line of each segment gets the call index
    the store's view gives it (three writers on five rollouts, clocks that tie, disagree or are
    missing, segments cut at random, one uploaded twice, torn and part-written pieces, a lost line);
    a segment's read then needs no other segment (issue 46: a read task per segment)."""
    rng = random.Random(seed)
    spool, url = str(tmp_path / "spool"), f"segments://{tmp_path}/store"
    call = 0
    uploader = Uploader(spool, url)
    for writer in ("host.1.aaaa", "host.2.bbbb", "host.3.cccc"):
        lines, clock = [], 0.0
        for _ in range(rng.randrange(0, 40)):
            call += 1
            clock += rng.choice([0.0, 0.5, 1.0, -2.0])  # Ties, and a clock that steps back.
            line = _line(call, clock)
            if rng.random() < 0.1:
                line = line.replace(b'"completed_at":' + orjson.dumps(clock), b'"completed_at":null')
            lines.append((f"r{rng.randrange(5)}", line))
        cuts = sorted(rng.sample(range(len(lines) + 1), min(len(lines) + 1, rng.randrange(1, 5))))
        for sequence, (start, end) in enumerate(zip([0, *cuts], [*cuts, len(lines)]), start=1):
            path = _write_segment(spool, writer, sequence, lines[start:end])
            if rng.random() < 0.3:  # An append that failed part-way (then a newline), or a torn tail.
                with open(path, "ab") as handle:
                    handle.write(b"r1\t{\"model_call_id\": \"part\n" if rng.random() < 0.5 else b"r2\t{\"tor")
            with open(path, "rb") as handle:
                data = handle.read()
            uploader.upload_all()
            if rng.random() < 0.2:  # Uploaded again under a later sequence (the same bytes: read once).
                with open(_write_segment(spool, writer, sequence + 100, []), "wb") as handle:
                    handle.write(data)
                uploader.upload_all()
    if rng.random() < 0.5:
        open(os.path.join(spool, "r3.capture.incomplete"), "wb").close()
        uploader.upload_all()
    view = CaptureStore(store_view(url, str(tmp_path / "view")))
    want = {(rollout_id, index, line["model_call_id"]) for rollout_id in view.rollout_ids()
            for index, line in view.iter_available(rollout_id)}
    reads = plan_segment_reads(url)
    got = [(rollout_id, index, line["model_call_id"]) for read in reads for rollout_id, index, line in read.lines()]
    assert len(got) == len(set(got)) and set(got) == want
    assert len(reads) == len({read.sha256 for read in reads})
    for read in reads:
        assert read.incomplete == ({"r3"} & set(read.indexes)) if view.is_incomplete("r3") else not read.incomplete


def test_the_writer_keeps_each_lines_completed_at_as_a_reader_parses_it(tmp_path):
    """The writer notes each line's ``completed_at`` as it appends (so the uploader does not parse
    the segment for its manifest): the same values, in the same order, as every reader's parse of
    the segment's whole lines (floats, integers, exponents, null, none, and one in a nested object)."""
    from capture.journal import SegmentFiles
    from records.contract import segment_order

    spool, url = str(tmp_path / "spool"), f"segments://{tmp_path}/store"
    segments = SegmentFiles(SegmentPolicy(spool, max_bytes=4000))
    rng = random.Random(7)
    values = [1767225600.25, 1767225601, 1.5e9, None, -3.0, 0]
    for batch in range(40):
        appends = []
        for rollout in rng.sample(["r0", "r1", "r2", "r3"], rng.randrange(1, 4)):
            lines = []
            for _ in range(rng.randrange(1, 3)):
                fields = {"model_call_id": f"{batch}-{rollout}-{len(lines)}", "dialect": "responses",
                          "model_ref": {"type": "responses_api_models", "name": 'a "completed_at": 1 model'},
                          "started_at": 1.0}
                choice = rng.randrange(len(values) + 1)
                if choice < len(values):
                    fields["completed_at"] = values[choice]
                fields["response"] = {"completed_at": 99, "output": []}  # The Responses API's own field.
                lines.append(orjson.dumps(fields) + b"\n")
            appends.append((os.path.join(spool, f"{rollout}.capture.jsonl"), b"".join(lines)))
        entry, _ = segments.append_batch(appends)
        segments.release(entry)
    segments.close_all()
    paths = sealed_segments(spool)
    assert len(paths) > 3  # Sealed by size, several times.
    wanted = []
    for path in paths:
        with open(path, "rb") as handle:
            wanted.append(segment_order(handle.read()))
    uploader = Uploader(spool, url)
    assert uploader.upload_all() == len(paths)
    store = tmp_path / "store"
    manifests = [json.loads(path.read_text()) for path in sorted((store / "manifests").rglob("*.json"))]
    assert [manifest["completed_at"] for manifest in manifests] == wanted


def test_merge_keeps_each_writers_order_when_clocks_disagree():
    late_first = [b'{"completed_at": 5}', b'{"completed_at": 1}', b'{"completed_at": 6}']
    other = [b'{"completed_at": 2}', b'{"completed_at": 5.5}']
    merged = merge_writers([("a", late_first), ("b", other)])
    assert [merged.index(line) for line in late_first] == sorted(merged.index(line) for line in late_first)
    assert merged == [other[0], late_first[0], late_first[1], other[1], late_first[2]]


def test_a_damaged_segment_is_refused_not_read(tmp_path):
    spool, url = str(tmp_path / "spool"), f"segments://{tmp_path}/store"
    _write_segment(spool, "host.1.aaaa", 1, [("r1", _line(1, 1.0))])
    Uploader(spool, url).upload_all()
    manifest = json.loads((tmp_path / "store" / manifest_name("host.1.aaaa", 1)).read_text())
    (tmp_path / "store" / manifest["segment"]).write_bytes(b"r1\t{}\n")
    with pytest.raises(SegmentDamaged):
        store_view(url)


def test_segments_a_dead_writer_left_open_are_sealed_and_a_live_ones_are_not(tmp_path):
    """A writer is alive while it holds its `.alive` lock (never told by its pid: a restarted
    container's process has the pid the dead one had)."""
    from capture.journal import SegmentFiles
    spool = str(tmp_path / "spool")
    live = SegmentFiles(SegmentPolicy(spool, 1 << 20, 3600))
    entry, _ = live.append(os.path.join(spool, "r9.capture.jsonl"), _line(9, 1.0) + b"\n")
    live.release(entry)  # Its barrier is done with it (the committer's part).
    directory = os.path.join(spool, "segments", f"{socket.gethostname()}.{os.getpid()}.dead")  # Our pid, yet dead.
    os.makedirs(directory)
    open(os.path.join(directory, ".alive"), "wb").close()
    with open(os.path.join(directory, "0000000003.open"), "wb") as handle:
        handle.write(b"r1\t" + _line(1, 1.0) + b"\n")
    open(os.path.join(directory, "0000000004.open"), "wb").close()
    assert seal_leftovers(spool) == 1
    assert sorted(os.listdir(directory)) == [".alive", "0000000003.sealed"]
    assert [name for name in os.listdir(live.directory) if name != ".alive"] == ["0000000001.open"]
    live.close_all()
    assert sorted(os.listdir(live.directory)) == [".alive", "0000000001.rollouts", "0000000001.sealed"]
    assert SegmentPolicy.from_argument(SegmentPolicy(spool, 4096, 1.0).as_argument()) == SegmentPolicy(spool, 4096, 1.0)


async def _chat(http: aiohttp.ClientSession, url: str, rollout: str, content: str, stream: bool) -> bool:
    """One call; True when the client had its whole reply (acknowledged)."""
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "stream": stream}
    try:
        async with http.post(f"{url}/ng-rollout/{rollout}/v1/chat/completions", json=body) as reply:
            data = await reply.read()
            return reply.status == 200 and (not stream or data.rstrip().endswith(b"data: [DONE]"))
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
        return False


def _contents(url: str, rollouts: list[str]) -> dict[str, list[str]]:
    store = CaptureStore(url, allow_empty=True)  # Read along as the store fills: empty at first.
    found = {}
    for rollout in rollouts:
        if os.path.exists(store.path_for(rollout)):
            found[rollout] = [line["request"]["messages"][-1]["content"] for line in store.read(rollout)]
    return found


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["segments", "s3"])
async def test_three_writers_sigkilled_twenty_times_lose_nothing_acknowledged(tmp_path, kind, request):
    """Three sidecar processes write the same 50 rollouts into one store (a shared path, and a real
    S3 server on loopback), each with its own spool; one of them is SIGKILLed 20 times at random
    (between appends, seals, uploads and manifests) and restarted on its spool; a reader reads the
    store all along. Every acknowledged call is read exactly once, in the rollout it was sent to;
    no line twice, none torn; the reader never saw a line twice either."""
    url = f"segments://{tmp_path}/store"
    if kind == "s3":
        request.getfixturevalue("s3_server")
        url = "s3://captures/killed"
    rollouts = [f"rollout-{n}" for n in range(50)]

    def start(index: int) -> SidecarProcess:
        return SidecarProcess.start("--stand-in", "--capture-dir", str(tmp_path / f"spool-{index}"),
                                    "--capture-store", url, "--segment-max-bytes", "65536",
                                    "--segment-max-age", "0.2", "--drain-timeout", "10")

    sidecars = [start(index) for index in range(3)]
    acknowledged: dict[str, str] = {}
    rng = random.Random(46)
    stop = asyncio.Event()
    seen_twice: list[str] = []

    async def drive(worker: int) -> None:
        call = 0
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            while not stop.is_set():
                call += 1
                content, rollout = f"w{worker}-call{call}", rng.choice(rollouts)
                if await _chat(http, rng.choice(sidecars).url, rollout, content, stream=call % 2 == 0):
                    acknowledged[content] = rollout

    async def read_all_along() -> None:
        while not stop.is_set():
            found = await asyncio.get_running_loop().run_in_executor(None, _contents, url, rollouts[:10])
            seen_twice.extend(c for lines in found.values() for c in lines if lines.count(c) > 1)
            await asyncio.sleep(0.2)

    drivers = [asyncio.ensure_future(drive(worker)) for worker in range(6)]
    reader = asyncio.ensure_future(read_all_along())
    try:
        for _ in range(soak_or(5, 20) if kind == "s3" else soak_or(6, 20)):  # `make soak` kills 20 times.
            await asyncio.sleep(rng.uniform(0.05, 0.4))
            index = rng.randrange(3)
            sidecars[index].kill()
            sidecars[index] = await asyncio.get_running_loop().run_in_executor(None, start, index)
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        try:
            await asyncio.gather(*drivers, reader)
        finally:  # A failed driver or reader must not leave the sidecars running.
            codes = [sidecar.terminate() for sidecar in sidecars]
    assert codes == [0, 0, 0], "".join(line for sidecar in sidecars for line in sidecar.stderr_lines)
    for index in range(3):  # A drained sidecar leaves nothing in its spool: all of it went.
        assert sealed_segments(str(tmp_path / f"spool-{index}")) == [], "".join(sidecars[index].stderr_lines)
    assert len(acknowledged) > 100
    found = _contents(url, rollouts)
    every = [content for lines in found.values() for content in lines]
    assert len(every) == len(set(every)), "a line was read twice"
    missing = [content for content in acknowledged if content not in set(every)]
    assert missing == [], f"{len(missing)} acknowledged calls are not in the store: {_where(tmp_path, missing)}"
    placed = {content: rollout for rollout, lines in found.items() for content in lines}
    assert all(placed[content] == rollout for content, rollout in acknowledged.items())
    assert seen_twice == []
    # Each segment read alone (Ray's read task per segment) places every line as the view does:
    # the writers' own orders (sealed segments) and the uploader's reads of those a SIGKILL left open.
    view = CaptureStore(store_view(url, str(tmp_path / "view")))
    want = {(rollout_id, index, line["model_call_id"]) for rollout_id in view.rollout_ids()
            for index, line in view.iter_available(rollout_id)}
    got = [(rollout_id, index, line["model_call_id"]) for read in plan_segment_reads(url)
           for rollout_id, index, line in read.lines()]
    assert len(got) == len(set(got)) == len(want) and set(got) == want


def _where(root, contents: list[str]) -> list[str]:
    """Which files under ``root`` hold each missing call (a failure's evidence)."""
    found = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            with open(path, "rb") as handle:
                data = handle.read()
            found += [f"{content} in {os.path.relpath(path, root)}" for content in contents if content.encode() in data]
    return found


@pytest.fixture
def s3_server(monkeypatch):
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    import boto3
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="captures")
    yield endpoint
    server.stop()


@pytest.mark.slow
async def test_an_s3_store_through_sidecar_processes_reads_as_the_lines_written(s3_server, tmp_path):
    """Two sidecars upload to a real S3 server; the readers (records, CaptureStore, the CLI's) read
    the store URL; its compacted view is Gym's per-rollout files with the lines' own bytes."""
    url = "s3://captures/run-7"
    sidecars = [SidecarProcess.start("--stand-in", "--capture-dir", str(tmp_path / f"spool-{i}"), "--capture-store",
                                     url, "--segment-max-age", "0.2") for i in range(2)]
    sent = []
    async with aiohttp.ClientSession() as http:
        for call in range(12):
            content = f"call-{call}"
            assert await _chat(http, sidecars[call % 2].url, f"r{call % 3}", content, stream=call % 4 == 0)
            sent.append((f"r{call % 3}", content))
    for sidecar in sidecars:
        assert sidecar.terminate() == 0, "".join(sidecar.stderr_lines)
    found = _contents(url, ["r0", "r1", "r2"])
    assert sorted((rollout, content) for rollout, lines in found.items() for content in lines) == sorted(sent)
    assert [len(read_model_call_records(url, rollout)) for rollout in ("r0", "r1", "r2")] == [4, 4, 4]
    view = compact_store(url, str(tmp_path / "gym"))
    import s3fs
    fs = s3fs.S3FileSystem(endpoint_url=s3_server)
    segment_lines = {}
    for path in fs.find("captures/run-7/segments"):
        for raw in fs.cat_file(path).split(b"\n"):
            if raw:
                rollout, _, line = raw.partition(b"\t")
                segment_lines.setdefault(rollout.decode(), set()).add(line)
    for rollout in ("r0", "r1", "r2"):
        with open(os.path.join(view, f"{rollout}.capture.jsonl"), "rb") as handle:
            assert set(handle.read().splitlines()) == segment_lines[rollout]
    assert hashlib.sha256(b"").hexdigest() not in "".join(fs.find("captures/run-7/segments"))  # No empty segment.


async def test_a_store_that_refuses_never_fails_a_call_and_the_spool_keeps_the_lines(tmp_path):
    """The store cannot be written (its path is a file): calls are answered as ever; /-/ready stays
    200 and says the lag and the problem; once the store takes writes, the drain uploads the lines."""
    store = tmp_path / "store"
    store.write_text("not a directory")
    url = f"segments://{store}"
    sidecar = SidecarProcess.start("--stand-in", "--capture-dir", str(tmp_path / "spool"), "--capture-store", url,
                                   "--segment-max-age", "0.1")
    try:
        async with aiohttp.ClientSession() as http:
            for call in range(3):
                assert await _chat(http, sidecar.url, "r1", f"call-{call}", stream=False)
            ready = {}
            for _ in range(100):
                async with http.get(sidecar.url + "/-/ready") as reply:
                    ready = await reply.json()
                    assert reply.status == 200
                if ready["upload_lag"]["segments"] and "store_problem" in ready:
                    break
                await asyncio.sleep(0.05)
        assert ready["upload_lag"]["segments"] >= 1 and "store_problem" in ready, ready
        assert ready["capture"] == "ok"
    finally:
        store.unlink()
        store.mkdir()
        assert sidecar.terminate() == 0
    assert _contents(url, ["r1"]) == {"r1": ["call-0", "call-1", "call-2"]}
    assert "cannot upload to" in "".join(sidecar.stderr_lines)


@pytest.mark.slow
async def test_workers_say_the_spools_lag_once_not_once_per_worker(tmp_path):
    """``--workers 2`` on one spool: every worker reports the spool's whole upload lag, so the
    merged ``/-/metrics`` takes it once (the largest reading), and the capture dir's writability as
    one gauge of 0 or 1, not a sum over the workers."""
    store = tmp_path / "store"
    store.write_text("not a directory")  # A store that refuses: the sealed segments stay, the lag grows.
    spool = tmp_path / "spool"
    sidecar = SidecarProcess.start("--stand-in", "--workers", "2", "--capture-dir", str(spool), "--capture-store",
                                   f"segments://{store}", "--segment-max-age", "0.1")
    try:
        async with aiohttp.ClientSession() as http:
            for call in range(64):  # A connection each, until both workers took calls (the kernel picks).
                async with aiohttp.ClientSession() as fresh:
                    assert await _chat(fresh, sidecar.url, f"r{call}", f"call-{call}", stream=False)
                writers = spool / "segments"
                written = [writer for writer in (writers.iterdir() if writers.exists() else ())
                           if any(name.endswith((".open", ".sealed")) for name in os.listdir(writer))]
                if call >= 7 and len(written) == 2:
                    break
            sealed = -1
            for _ in range(20):  # Every segment sealed (by age, on the writers' sweep), the count steady.
                await asyncio.sleep(0.5)
                now = len(sealed_segments(str(spool)))
                if now == sealed >= 2:
                    break
                sealed = now
            await asyncio.sleep(2.5)  # Both workers' snapshots (once a second) see them all.
            assert len(sealed_segments(str(spool))) == sealed >= 2
            async with http.get(sidecar.url + "/-/metrics") as reply:
                gauges = {line.split()[0]: float(line.split()[1]) for line in (await reply.text()).splitlines()
                          if line.startswith(("mcc_upload_lag_segments ", "mcc_capture_dir_writable "))}
        assert gauges == {"mcc_upload_lag_segments": sealed, "mcc_capture_dir_writable": 1.0}
        writers = os.listdir(spool / "segments")
        assert len(writers) == 2, writers  # Each worker its own writer, so there were two to count.
    finally:
        store.unlink()
        store.mkdir()
        assert sidecar.terminate() == 0


@pytest.mark.slow
async def test_the_uploader_runs_apart_from_the_sidecar_and_comes_back_when_killed(tmp_path):
    """The uploader is a process of its own (its reads, hashes and puts never take turns with the
    event loop); SIGKILLed, it is started again and what was sealed meanwhile still reaches the
    store; the sidecar's log says so; the drain leaves nothing behind, the uploader included."""
    import signal
    import subprocess

    url = f"segments://{tmp_path}/store"
    sidecar = SidecarProcess.start("--stand-in", "--capture-dir", str(tmp_path / "spool"), "--capture-store", url,
                                   "--segment-max-age", "0.1")

    def uploaders() -> list[int]:
        children = subprocess.run(["pgrep", "-P", str(sidecar.process.pid)], capture_output=True, text=True).stdout
        found = []
        for child in children.split():
            with open(f"/proc/{child}/cmdline", "rb") as handle:
                if b"_upload_process" in handle.read():
                    found.append(int(child))
        return found

    try:
        [first] = uploaders()
        os.kill(first, signal.SIGKILL)
        async with aiohttp.ClientSession() as http:
            for call in range(4):
                assert await _chat(http, sidecar.url, "r1", f"call-{call}", stream=False)
        for _ in range(200):  # Started again within its restart pause (5 s).
            await asyncio.sleep(0.05)
            again = uploaders()
            if again and again != [first]:
                break
        assert again and first not in again
        for _ in range(200):
            if sorted(_contents(url, ["r1"]).get("r1", [])) == [f"call-{call}" for call in range(4)]:
                break
            await asyncio.sleep(0.05)
        assert _contents(url, ["r1"]) == {"r1": [f"call-{call}" for call in range(4)]}
    finally:
        assert sidecar.terminate() == 0
    assert "the uploader process" in "".join(sidecar.stderr_lines) and "starting it again" in "".join(sidecar.stderr_lines)
    assert subprocess.run(["pgrep", "-f", f"_upload_process.*{tmp_path}"], capture_output=True).returncode == 1


@pytest.mark.parametrize("fstype, options, said", [
    ("ext4", "rw", None), ("xfs", "rw", None), ("ceph", "rw", None), ("lustre", "rw,flock", None),
    ("nfs4", "rw,vers=4.2,local_lock=none", None), ("nfs4", "rw,vers=4.2,local_lock=flock", "O_APPEND is not atomic"),
    ("nfs", "rw,vers=3,nolock", "O_APPEND"), ("gpfs", "rw", "node-local"),
    ("fuse.gcsfuse", "rw", "do not append"), ("fuse.mountpoint-s3", "rw", "FUSE"), ("lustre", "rw", "flock"),
])
def test_the_default_layout_is_said_unsafe_where_it_is(fstype, options, said):
    from proxy.app import layout_caveat
    caveat = layout_caveat(fstype, options)
    assert (caveat is None) if said is None else (said in caveat)


def test_the_mount_options_are_read_from_the_mount_table():
    """The deepest mount holding the directory gives its options (Lustre's ``flock``)."""
    from proxy.app import mount_options
    table = ("36 35 0:30 / /data rw,relatime shared:1 - fuse.gcsfuse gcsfuse rw,user_id=0\n"
             "37 35 0:31 / /data/lustre rw - lustre 10.0.0.1@tcp:/fs rw,flock\n")
    assert mount_options("/data/x", table) == "rw,user_id=0"
    assert mount_options("/data/lustre/x", table) == "rw,flock"


@pytest.mark.slow
async def test_the_token_mode_ships_its_files_through_the_store_across_a_sigkill(tmp_path):
    """The token capture mode with a capture store: the spool's training-token files reach the
    store (shipped once still, and by the drain; after a SIGKILL, by the next start on the spool).
    A rollout written by one sidecar reads as it would from a capture dir; one re-pinned across two
    sidecars keeps every entry of both."""
    from records import read_token_records, trajectories
    url = f"segments://{tmp_path}/store"

    def start(index: int) -> SidecarProcess:
        return SidecarProcess.start("--stand-in", "--capture-dir", str(tmp_path / f"spool-{index}"), "--capture-store",
                                    url, "--capture-tokens", "--segment-max-age", "0.2")

    async def converse(sidecar: SidecarProcess, rollout: str, turns: list[str], history: list) -> list:
        async with aiohttp.ClientSession() as http:
            for text in turns:
                history.append({"role": "user", "content": text})
                async with http.post(f"{sidecar.url}/ng-rollout/{rollout}/v1/chat/completions",
                                     json={"model": "m", "messages": history}) as reply:
                    assert reply.status == 200
                    history.append({"role": "assistant", "content": (await reply.json())["choices"][0]["message"]["content"]})
        return history

    first, second = start(0), start(1)
    await converse(first, "alone", ["hi", "more"], [])
    pinned = await converse(first, "pinned", ["hi", "more"], [])
    await converse(second, "pinned", ["and then"], pinned)
    forged = await converse(first, "forged", ["hi"], [])
    await converse(second, "forged", ["and then"], [forged[0], {"role": "assistant", "content": "never said"}])
    first.kill()  # Its token files are in its spool, not yet shipped (0.2 s still) or shipped: either way
    first = start(0)  # the next start on the spool ships what the store lacks.
    for sidecar in (first, second):
        assert sidecar.terminate() == 0, "".join(sidecar.stderr_lines)
    alone = read_token_records(url, "alone")
    assert [record.usable for record in alone] == [True, True] and alone[1].extends == 0  # Turn 2 extends turn 1.
    pinned_records = read_token_records(url, "pinned")
    assert len(pinned_records) == 3 and all(record.generation_token_ids for record in pinned_records)
    # The second sidecar could not resolve its call (the first's are in the first's spool): the
    # store's view links it to the call it continues, as one token file on a shared volume would.
    pinned = trajectories(url, "pinned")
    assert not pinned.masked and len(pinned.chains) == 1 and len(pinned.main.calls) == 3, pinned.mask_reason
    view = compact_store(url, str(tmp_path / "gym"))
    assert {"alone.tokens.jsonl", "alone.tokens.intents", "pinned.tokens.jsonl"} <= set(os.listdir(view))
    with open(os.path.join(view, "pinned.tokens.jsonl"), "rb") as handle:
        linked = [orjson.loads(line) for line in handle.read().splitlines()]
    by_id = {entry["model_call_id"]: entry for entry in linked}  # Joined in spool-id order: find them by id.
    [third] = [entry for entry in linked if entry.get("linked_across_spools")]
    second = by_id[third["parent_call_id"]]
    assert third["parent_resolution"] == second["parent_resolution"] == "resolved"
    assert by_id[second["parent_call_id"]]["parent_resolution"] == "root" and len(linked) == 3
    # A call that continues nothing either sidecar made stays unresolved: never a guess.
    assert trajectories(url, "forged").masked
    with open(os.path.join(view, "forged.tokens.jsonl"), "rb") as handle:
        assert sorted(orjson.loads(line)["parent_resolution"] for line in handle.read().splitlines()) == ["root",
                                                                                                          "unresolved"]


def test_a_view_follows_its_store_reading_only_the_manifests_of_the_rollouts_that_changed(tmp_path):
    """A view brought up to date lists each writer's manifests after the last it applied and
    rebuilds the rollouts the new ones name from their own manifests: an old manifest of a rollout
    that did not change is not read again (here it is made unreadable, in the store and in the
    cache: a view that parsed every manifest at each look would fail). docs/reading.md, "At a long
    run's scale"."""
    spool, url = str(tmp_path / "spool"), f"segments://{tmp_path}/store"
    _write_segment(spool, "host.1.aaaa", 1, [("old", _line(1, 10.0))])
    _write_segment(spool, "host.1.aaaa", 2, [("kept", _line(2, 11.0))])
    uploader = Uploader(spool, url)
    assert uploader.upload_all() == 2
    view = store_view(url)
    assert read_model_call_records(view, "old")[0].request == {"call": 1}
    stale = manifest_name("host.1.aaaa", 1)
    for path in (os.path.join(str(tmp_path / "store"), *stale.split("/")),
                 os.path.join(str(tmp_path / "store-cache"), os.listdir(tmp_path / "store-cache")[0], *stale.split("/"))):
        with open(path, "wb") as handle:
            handle.write(b"not a manifest")
    _write_segment(spool, "host.1.aaaa", 3, [("kept", _line(3, 12.0)), ("new", _line(4, 13.0))])
    _write_segment(spool, "host.2.bbbb", 1, [("new", _line(5, 14.0))])  # A writer that came since.
    assert uploader.upload_all() == 2
    # Brought up to date by another process (a restarted consumer: nothing parsed in memory).
    again = subprocess.run([sys.executable, "-c", "import sys; from records.store import store_view; "
                            "print(store_view(sys.argv[1]))", url], capture_output=True, text=True, cwd=CHECKOUT,
                           env={**os.environ, "PYTHONPATH": CHECKOUT})
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == view
    assert [record.request for record in read_model_call_records(view, "kept")] == [{"call": 2}, {"call": 3}]
    assert [record.request for record in read_model_call_records(view, "new")] == [{"call": 4}, {"call": 5}]
    assert read_model_call_records(view, "old")[0].request == {"call": 1}
