"""The capture process (issue 34): lines appended outside the sidecar's interpreter, acknowledged
line by line; its wire at every split; a process that dies fails only the lines it had not
acknowledged, never a reply, and the sidecar appends on its own threads from then on."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import random
import signal
import socket
import sys
import threading

import orjson
import pytest

from capture.journal import BUILD_ON_LOOP_BYTES, Job, JobLine, frame_line, persist_process_command, pickle_fields
import capture.journal._process_main as process_main
from capture.journal._process_main import ACK as PERSIST_ACK
from capture.journal._process_main import FIELDS as PERSIST_FIELDS
from capture.journal._process_main import JOB as PERSIST_JOB
from capture.journal._process_main import LINE as PERSIST_LINE
from capture.journal._process_main import NOT_BUILT as PERSIST_NOT_BUILT
from capture.journal._process_main import NOT_ENCODED as PERSIST_NOT_ENCODED
from capture.journal._process_main import READY as PERSIST_READY
from capture.journal._process_main import main as serve_main
import capture.journal._process_client as capture_process
import capture.journal._writer as capture_writer
from records import CaptureStore
from records.contract import encode_capture_line

from tests.processes import SidecarProcess, post_chat
from tests.scripted_upstream import json_script, sse_script
from tests.proxy.app.test_metrics_and_logs import scrape, value
from tests.transcripts import CHAT_REQUEST, CHAT_STREAM
from tests.vllm_chat_model import FRAMINGS, chat_payloads, text_tokens
from tests.wire import assert_same_reply, fetch, rollout_url

CHAT = "/v1/chat/completions"
REPLY = {"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def _run_in_thread(directory: str) -> tuple[socket.socket, threading.Thread]:
    """The capture process's loop on a thread of this process, on one end of a socket pair."""
    ours, theirs = socket.socketpair()
    ours.settimeout(20)  # A process that stops reading fails the test instead of hanging it.
    argv = persist_process_command(theirs.fileno(), directory, "auto")[3:]
    thread = threading.Thread(target=lambda: (serve_main(argv), theirs.close()), daemon=True)
    thread.start()
    assert ours.recv(1) == PERSIST_READY, "the process says it is ready before anything else"
    return ours, thread


def _read_acks(sock: socket.socket, count: int, replies: list[bytes] | None = None) -> list[tuple[int, int, int, float]]:
    """``count`` acknowledgements (number, code, size, seconds); each one's reply (a job's) into
    ``replies``, else it must be empty."""
    data, acks, at = b"", [], 0
    while len(acks) < count:
        if len(data) - at >= PERSIST_ACK.size:
            number, code, size, seconds, reply_size = PERSIST_ACK.unpack_from(data, at)
            if len(data) - at - PERSIST_ACK.size >= reply_size:
                reply = data[at + PERSIST_ACK.size:at + PERSIST_ACK.size + reply_size]
                at += PERSIST_ACK.size + reply_size
                acks.append((number, code, size, seconds))
                if replies is None:
                    assert reply == b"", "a line's acknowledgement carries no reply"
                else:
                    replies.append(reply)
                continue
        chunk = sock.recv(65536)
        assert chunk, "the capture process closed before acknowledging every line"
        data += chunk
    assert at == len(data), "nothing follows the last acknowledgement"
    return acks


def _fields(index: int) -> dict:
    """Fields of a line as the sidecar builds them: text with what JSON must escape, nested values,
    and a stream's per-token lists kept as JSON text (`orjson.Fragment`, which pickle refuses)."""
    return {"model_call_id": f"c{index}", "response_raw": 'data: {"x":"\\"é\\n"}\n\n' * index,
            "response": {"choices": [{"index": 0, "delta": {"content": "🙂" * index},
                                      "token_ids": orjson.Fragment(b"[%d,7]" % index)}]}, "latency_ms": index / 3}


@pytest.mark.parametrize("split", ["whole", "byte by byte", "random"])
def test_every_line_is_appended_once_and_acknowledged_whatever_the_reads(tmp_path, split):
    """Every third line goes as its fields pickled: the process writes what `encode_capture_line` gives."""
    lines = []
    for index in range(1, 41):
        path = str(tmp_path / f"r{index % 3}.capture.jsonl")
        if index % 3:
            lines.append((index, path, orjson.dumps({"n": index, "pad": "x" * index}) + b"\n", PERSIST_LINE))
        else:
            lines.append((index, path, pickle_fields(_fields(index)), PERSIST_FIELDS))
    expected = {number: encode_capture_line(pickle.loads(payload)) if kind == PERSIST_FIELDS else payload
                for number, _, payload, kind in lines}
    wire = b"".join(frame_line(number, os.fsencode(path), payload, kind) for number, path, payload, kind in lines)
    sock, thread = _run_in_thread(str(tmp_path))
    rng = random.Random(split)
    if split == "whole":
        pieces = [wire]
    elif split == "byte by byte":
        pieces = [wire[i:i + 1] for i in range(len(wire))]
    else:
        cuts = sorted(rng.sample(range(1, len(wire)), 25))
        pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)])]
    for piece in pieces:
        sock.sendall(piece)
    acks = _read_acks(sock, len(lines))
    sock.close()
    thread.join(10)
    assert [number for number, *_ in acks] == [number for number, *_ in lines]
    assert all(code == 0 for _, code, _, _ in acks)
    assert [size for _, _, size, _ in acks] == [len(expected[number]) for number, *_ in lines]
    for name in ("r0", "r1", "r2"):
        on_disk = (tmp_path / f"{name}.capture.jsonl").read_bytes()
        assert on_disk == b"".join(expected[number] for number, path, _, _ in lines
                                   if path.endswith(f"/{name}.capture.jsonl"))


def test_fields_json_cannot_hold_are_acknowledged_not_encoded_and_fail_alone(tmp_path):
    """A value JSON has no form for (as `encode_capture_line` raises on the loop), or a payload that
    is no pickle: that line alone fails, nothing of it is appended."""
    path = str(tmp_path / "r.capture.jsonl")
    sock, thread = _run_in_thread(str(tmp_path))
    sock.sendall(frame_line(1, os.fsencode(path), pickle_fields({"n": 2 ** 70}), PERSIST_FIELDS)
                 + frame_line(2, os.fsencode(path), pickle_fields(_fields(2)), PERSIST_FIELDS)
                 + frame_line(3, os.fsencode(path), b"not a pickle", PERSIST_FIELDS)
                 + frame_line(4, os.fsencode(path), b'{"a":1}\n')
                 + frame_line(5, os.fsencode(path), b'{"b":1}\n', 7))  # A kind it does not know.
    acks = {number: (code, size) for number, code, size, _ in _read_acks(sock, 5)}
    sock.close()
    thread.join(10)
    second = encode_capture_line(_fields(2))
    assert acks == {1: (PERSIST_NOT_ENCODED, 0), 2: (0, len(second)), 3: (PERSIST_NOT_ENCODED, 0), 4: (0, 8),
                    5: (PERSIST_NOT_ENCODED, 0)}
    assert (tmp_path / "r.capture.jsonl").read_bytes() == second + b'{"a":1}\n'


def test_a_line_longer_than_a_batch_is_read_whole(tmp_path):
    """A raw 32k-token stream's line can exceed what the process reads before it appends (8 MiB)."""
    line = b'{"raw":"' + b"x" * (9 << 20) + b'"}\n'
    path = str(tmp_path / "big.capture.jsonl")
    sock, thread = _run_in_thread(str(tmp_path))
    sender = threading.Thread(target=sock.sendall, args=(frame_line(7, os.fsencode(path), line),))
    sender.start()
    ((number, code, size, _),) = _read_acks(sock, 1)
    sender.join(10)
    sock.close()
    thread.join(10)
    assert (number, code, size) == (7, 0, len(line))
    assert (tmp_path / "big.capture.jsonl").read_bytes() == line


def test_a_line_the_disk_refuses_is_acknowledged_with_its_errno_and_fails_alone(tmp_path):
    good = str(tmp_path / "ok.capture.jsonl")
    missing = str(tmp_path / "gone" / "x.capture.jsonl")  # Its directory does not exist: ENOENT.
    sock, thread = _run_in_thread(str(tmp_path))
    sock.sendall(frame_line(1, os.fsencode(missing), b"{}\n") + frame_line(2, os.fsencode(good), b'{"a":1}\n'))
    acks = {number: (code, size) for number, code, size, _ in _read_acks(sock, 2)}
    sock.close()
    thread.join(10)
    assert acks == {1: (2, 0), 2: (0, 8)}  # errno 2: ENOENT.
    assert (tmp_path / "ok.capture.jsonl").read_bytes() == b'{"a":1}\n'


async def test_lines_go_through_the_capture_process_and_it_ends_with_the_sidecar(http, upstream, start, capture_dir):
    upstream.scripts[CHAT] = json_script(orjson.dumps(REPLY))
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    writer = sidecar.sidecar.journal
    pid = writer.process_pid
    assert pid is not None and pid != os.getpid()
    for index in range(5):
        direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_REQUEST)
        assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, f"p{index % 2}", CHAT), CHAT_REQUEST))
    assert [len(CaptureStore(capture_dir).read_available(f"p{i}").lines) for i in (0, 1)] == [3, 2]
    await sidecar.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # Reaped by the sidecar: gone, not a zombie.


async def test_a_capture_process_that_dies_fails_only_its_unacknowledged_lines_never_a_reply(
        http, upstream, start, capture_dir, caplog):
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM)
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_REQUEST)
    assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, "before", CHAT), CHAT_REQUEST))
    pid = sidecar.sidecar.journal.process_pid
    os.kill(pid, signal.SIGSTOP)  # Its line is sent, never acknowledged: the reply's end is held.
    with caplog.at_level(logging.ERROR, logger="mcc.capture"):
        held = asyncio.ensure_future(fetch(http, "POST", rollout_url(sidecar.url, "cut", CHAT), CHAT_REQUEST))
        await asyncio.sleep(0.5)
        assert not held.done(), "the reply's end waits for its line's acknowledgement"
        os.kill(pid, signal.SIGKILL)
        assert_same_reply(direct, await held)
    assert any("capture process" in record.getMessage() and "ended" in record.getMessage() for record in caplog.records)
    assert value(await scrape(http, sidecar), "mcc_capture_failures_total", kind="CaptureProcessLost") == 1
    assert os.path.exists(os.path.join(capture_dir, "cut.capture.incomplete"))
    assert sidecar.sidecar.journal.process_pid is None
    # From now on the sidecar appends on its own threads: nothing else is lost.
    assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, "after", CHAT), CHAT_REQUEST))
    store = CaptureStore(capture_dir)
    assert [len(store.read_available(r).lines) for r in ("before", "after")] == [1, 1]


#: What the jobs below saw, in order (they run in this process: the capture process's loop on a thread).
_JOB_EVENTS: list[str] = []


def _side_file_job(side: str, text: str) -> JobLine:
    """A job as the token mode's: it writes a file of its own, and its line names it."""
    if text == "raise":
        raise RuntimeError("a bug in the job")
    if text != "unwritten":
        with open(side, "a", encoding="utf-8") as handle:
            handle.write(text)
    return JobLine(orjson.dumps({"job": text}) + b"\n", [side], lambda exc: _JOB_EVENTS.append(f"not durable: {text}"),
                   lambda: {"text": text, "seen": list(_JOB_EVENTS)})


_SIDE_FILE_JOB = f"{__name__}:_side_file_job"


def test_a_job_makes_its_line_in_the_capture_process_and_its_files_are_durable_before_the_ack(tmp_path, monkeypatch):
    """The token mode's way (`capture.journal._jobs`): the process runs the job beside the lines,
    its other files go through the line's barrier before its acknowledgement, and its reply comes
    back with it. A job that raises fails alone (`NOT_BUILT`); a file the barrier cannot make
    durable fails its line with the errno and is told to the job."""
    made_durable = process_main.make_also_durable

    def recorded(also, outcomes, synced_device):
        made_durable(also, outcomes, synced_device)
        _JOB_EVENTS.extend(f"durable: {os.path.basename(path)}" for _, paths, _ in also for path in paths)
    monkeypatch.setattr(process_main, "make_also_durable", recorded)
    _JOB_EVENTS.clear()
    path = os.fsencode(str(tmp_path / "r.capture.jsonl"))

    def job(number: int, text: str, side: str) -> bytes:
        return frame_line(number, path, Job(_SIDE_FILE_JOB, (str(tmp_path / side), text), print).pickled(), PERSIST_JOB)
    sock, thread = _run_in_thread(str(tmp_path))
    sock.sendall(frame_line(1, path, b'{"a":1}\n') + job(2, "entry", "r.tokens") + job(3, "raise", "x.tokens")
                 + job(4, "unwritten", "gone.tokens") + frame_line(5, path, b'{"b":2}\n'))
    replies: list[bytes] = []
    acks = {number: (code, size) for number, code, size, _ in _read_acks(sock, 5, replies)}
    sock.close()
    thread.join(10)
    job_line = orjson.dumps({"job": "entry"}) + b"\n"
    assert acks == {1: (0, 8), 2: (0, len(job_line)), 3: (PERSIST_NOT_BUILT, 0), 4: (2, 0), 5: (0, 8)}
    assert (tmp_path / "r.tokens").read_text() == "entry"
    on_disk = (tmp_path / "r.capture.jsonl").read_bytes()
    assert on_disk.startswith(b'{"a":1}\n' + job_line) and on_disk.endswith(b'{"b":2}\n') and b"raise" not in on_disk
    assert replies[0] == replies[4] == b"", "a line replies nothing"
    assert replies[2] == b"RuntimeError: a bug in the job", "a job that raised says what"
    entry, unwritten = pickle.loads(replies[1]), pickle.loads(replies[3])
    assert entry["text"] == "entry" and "durable: r.tokens" in entry["seen"], "its reply is made after its barrier"
    assert "not durable: unwritten" in unwritten["seen"], "told before its reply"


class _JournalMetrics:
    def __init__(self) -> None:
        self.capture_write_problem = None
        self.durable: list[int] = []
        self.capture_failures = self

    def labels(self, kind: str) -> "_JournalMetrics":
        return self

    def inc(self) -> None:
        pass

    def line_durable(self, size: int, barrier_seconds: float) -> None:
        self.durable.append(size)


@pytest.mark.parametrize("process", [True, False], ids=["capture process", "writer threads"])
async def test_a_job_writes_the_same_files_in_the_capture_process_and_on_the_writer_threads(tmp_path, process):
    """One function, two places: where the process runs, and where it cannot (its reply to
    ``on_reply`` on the loop, before the line settles)."""
    journal = capture_writer.Journal(str(tmp_path), _JournalMetrics(), process=process)
    assert (journal.process_pid is not None) == process
    order: list[object] = []
    try:
        for text in ("one", "two"):
            job = Job(_SIDE_FILE_JOB, (str(tmp_path / "r.tokens"), text), lambda reply: order.append(reply["text"]))
            written = await journal.persist("r", lambda job=job: job, 10)
            order.append(written)
    finally:
        await journal.close()
    assert order == ["one", True, "two", True]
    assert (tmp_path / "r.tokens").read_text() == "onetwo"
    assert (tmp_path / "r.capture.jsonl").read_bytes() == b'{"job":"one"}\n{"job":"two"}\n'


async def test_the_token_capture_mode_writes_its_entries_in_the_capture_process(http, stand_in, start, capture_dir,
                                                                               monkeypatch):
    """The token mode's lines are jobs (docs/tokens.md): their entries are written in the capture
    process, outside the sidecar's interpreter; once it has died, on the writer threads, the same."""
    from records import read_token_records
    from records.contract import TokenFiles
    written_here: list[str] = []
    append = TokenFiles.append_indexed

    def spied(self, entry, *args, **kwargs):
        written_here.append(entry["rollout_id"])
        return append(self, entry, *args, **kwargs)
    monkeypatch.setattr(TokenFiles, "append_indexed", spied)
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    pid = sidecar.sidecar.journal.process_pid
    assert pid is not None
    store = CaptureStore(capture_dir)
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "entries"}]}
    for rollout in ("in-process", "on-threads"):
        if rollout == "on-threads":
            os.kill(pid, signal.SIGKILL)
            for _ in range(100):
                if sidecar.sidecar.journal.process_pid is None:
                    break
                await asyncio.sleep(0.05)
        reply = await fetch(http, "POST", rollout_url(sidecar.url, rollout, CHAT), orjson.dumps(body))
        assert reply.status == 200
        (line,) = store.read(rollout)
        assert line["token_entries"], "the arrays live in the entry, not the line"
        (record,) = read_token_records(store, rollout)
        assert record.usable and record.generation_token_ids
    assert written_here == ["on-threads"], "the first entry was written by the capture process"
    assert value(await scrape(http, sidecar), "mcc_token_entries_total", outcome="written") == 2


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as handle:
            children += [int(child) for child in handle.read().split()]
    return children


async def test_a_sidecar_killed_outright_leaves_no_capture_process_and_loses_nothing_acknowledged(upstream, tmp_path):
    upstream.scripts[CHAT] = json_script(orjson.dumps(REPLY))
    sidecar = SidecarProcess.start("--upstream", upstream.url, "--capture-dir", str(tmp_path))
    try:
        statuses = [(await asyncio.to_thread(post_chat, sidecar.url, f"k{index % 4}"))[0] for index in range(12)]
        (child,) = [pid for pid in _children(sidecar.process.pid)
                    if b"capture.journal._process_main" in open(f"/proc/{pid}/cmdline", "rb").read()]
    finally:
        sidecar.kill()
    assert statuses == [200] * 12
    for _ in range(200):  # Its socket closed with the sidecar: it appends what it had, then ends.
        if not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z":
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the capture process outlived its sidecar")
    store = CaptureStore(str(tmp_path))
    assert sum(len(store.read_available(f"k{index}").lines) for index in range(4)) == 12


async def test_a_large_call_s_line_is_built_off_the_loop_and_lands_whole(http, upstream, start, capture_dir):
    """Above `BUILD_ON_LOOP_BYTES` the line is built on a thread (a 32k-token stream's takes tens of
    ms: on the loop, every other call would stall that long) and still reaches the process."""
    upstream.scripts[CHAT] = json_script(orjson.dumps(REPLY))
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    big = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "q" * (BUILD_ON_LOOP_BYTES + 1)}]})
    direct = await fetch(http, "POST", upstream.url + CHAT, big)
    assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, "big", CHAT), big))
    (line,) = CaptureStore(capture_dir).read_available("big").lines
    assert line["request"] == orjson.loads(big) and line["response"] == REPLY
    assert any(thread.name.startswith("mcc-capture-build") for thread in threading.enumerate())


# A vLLM stream with logprobs and token ids, as the agent asked for them: the tap keeps its
# per-token lists as JSON text (`orjson.Fragment`s in the fields).
LOGPROB_STREAM = FRAMINGS["lf"](chat_payloads([text_tokens(*(f" w{i}" for i in range(40)))], logprobs=True,
                                              token_ids=True)) + b"data: [DONE]\n\n"


@pytest.mark.parametrize("stream", [CHAT_STREAM, LOGPROB_STREAM], ids=["chat", "logprobs and token ids"])
async def test_a_stream_s_line_is_encoded_by_the_process_as_the_loop_would_have(
        http, upstream, start, capture_dir, monkeypatch, stream):
    """A call of `ENCODE_IN_PROCESS_BYTES` or more (a stream: its line is mostly its raw text) goes
    as its fields, a small JSON call as its line; on disk, each is what the loop encodes."""
    upstream.scripts[CHAT] = sse_script(stream)
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    sent: list[tuple[bytes, int]] = []
    process = sidecar.sidecar.journal._process
    submit = process.submit
    monkeypatch.setattr(process, "submit", lambda path, payload, done, kind=PERSIST_LINE: (
        sent.append((payload, kind)), submit(path, payload, done, kind)))
    # Between the JSON call (the request and a 218-byte reply) and the stream (1,090 bytes).
    monkeypatch.setattr(capture_writer, "ENCODE_IN_PROCESS_BYTES", len(CHAT_REQUEST) + 512)
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_REQUEST)
    assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, "fields", CHAT), CHAT_REQUEST))
    upstream.scripts[CHAT] = json_script(orjson.dumps(REPLY))
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_REQUEST)
    assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, "line", CHAT), CHAT_REQUEST))
    assert [kind for _, kind in sent] == [PERSIST_FIELDS, PERSIST_LINE]
    on_disk = (open(os.path.join(capture_dir, "fields.capture.jsonl"), "rb").read(),
               open(os.path.join(capture_dir, "line.capture.jsonl"), "rb").read())
    assert on_disk == (encode_capture_line(pickle.loads(sent[0][0])), sent[1][0])
    (line,) = CaptureStore(capture_dir).read_available("fields").lines
    assert line["response_raw"] == stream.decode() and line["response"]["choices"]
    assert not [name for name in os.listdir(capture_dir) if name.endswith(".incomplete")]
    if stream is LOGPROB_STREAM:
        choice = line["response"]["choices"][0]
        assert choice["token_ids"] == list(range(100, 140)) and len(choice["logprobs"]["content"]) == 40


async def test_a_line_built_aside_while_the_process_dies_goes_to_the_writer_threads(
        http, upstream, start, capture_dir, monkeypatch):
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM)
    monkeypatch.setattr(capture_writer, "BUILD_ON_LOOP_BYTES", 0)  # Every line built aside,
    monkeypatch.setattr(capture_writer, "ENCODE_IN_PROCESS_BYTES", 0)  # as fields: the threads encode them.
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    writer = sidecar.sidecar.journal
    building, release = threading.Event(), threading.Event()
    build = capture_writer._payload

    def held_build(built, size):  # type: ignore[no-untyped-def]
        building.set()
        release.wait(10)
        return build(built, size)
    monkeypatch.setattr(capture_writer, "_payload", held_build)
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_REQUEST)
    call = asyncio.ensure_future(fetch(http, "POST", rollout_url(sidecar.url, "aside", CHAT), CHAT_REQUEST))
    assert await asyncio.to_thread(building.wait, 10)
    os.kill(writer.process_pid, signal.SIGKILL)
    for _ in range(100):
        if writer.process_pid is None:
            break
        await asyncio.sleep(0.05)
    release.set()
    assert_same_reply(direct, await call)
    assert len(CaptureStore(capture_dir).read_available("aside").lines) == 1, "built, then appended by the threads"
    assert not os.path.exists(os.path.join(capture_dir, "aside.capture.incomplete"))


async def test_a_capture_process_that_never_comes_up_loses_no_line(http, upstream, start, capture_dir, monkeypatch, caplog):
    """It ends before its first byte (here: exits at once; in life, an import that fails): the lines
    waiting for it were never sent, so the writer threads append them -- none is a failure."""
    monkeypatch.setattr(capture_process, "persist_process_command",
                        lambda fd, directory, sync_mode, segments=None: [sys.executable, "-c", "import sys, time; time.sleep(0.3); sys.exit(3)"])
    upstream.scripts[CHAT] = json_script(orjson.dumps(REPLY))
    with caplog.at_level(logging.ERROR, logger="mcc.capture"):
        sidecar = await start(upstream.url, capture_dir=capture_dir)
        direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_REQUEST)
        calls = [fetch(http, "POST", rollout_url(sidecar.url, f"early-{index}", CHAT), CHAT_REQUEST) for index in range(4)]
        for reply in await asyncio.gather(*calls):  # Sent before the process ended: they wait for it.
            assert_same_reply(direct, reply)
        assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, "late", CHAT), CHAT_REQUEST))
    assert any("before it was ready" in record.getMessage() for record in caplog.records)
    store = CaptureStore(capture_dir)
    assert [len(store.read_available(rollout).lines) for rollout in ("early-0", "early-1", "early-2", "early-3", "late")] \
        == [1] * 5
    assert not [name for name in os.listdir(capture_dir) if name.endswith(".incomplete")]
    assert value(await scrape(http, sidecar), "mcc_capture_failures_total", kind="CaptureProcessLost") == 0


async def test_a_capture_process_that_cannot_start_leaves_the_lines_to_the_writer_threads(
        http, upstream, start, capture_dir, monkeypatch, caplog):
    monkeypatch.setattr(capture_process, "persist_process_command", lambda fd, directory, sync_mode: ["/nonexistent/python"])
    upstream.scripts[CHAT] = json_script(orjson.dumps(REPLY))
    with caplog.at_level(logging.WARNING, logger="mcc.capture"):
        sidecar = await start(upstream.url, capture_dir=capture_dir)
    assert sidecar.sidecar.journal.process_pid is None
    assert any("cannot start the capture process" in record.getMessage() for record in caplog.records)
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_REQUEST)
    assert_same_reply(direct, await fetch(http, "POST", rollout_url(sidecar.url, "threads", CHAT), CHAT_REQUEST))
    assert len(CaptureStore(capture_dir).read_available("threads").lines) == 1
