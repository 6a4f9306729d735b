"""A sidecar with one part of capture taken out, for `bench_floors.py`'s decomposition only.

    python benchmarks/floors_sidecar.py <part> serve --upstream ... --capture-dir ...

``<part>``: ``none`` (the sidecar as shipped), ``barrier`` (lines are built and appended but no
fsync or syncfs runs: what the durability barrier costs), ``persistence`` (no line is built or
written; every call is settled at once: what the relay's own capture bookkeeping costs, the tap,
the exchange, the held reply). Each is the shipped code with one method replaced in this process:
never a mode of the product (a call would be acknowledged before its line is durable).

``process`` keeps the promise and moves persistence out of the sidecar's process: each line is
built on the event loop and sent to a child with one thread, which appends the lines that came
together (the file contract's lock), makes them durable (fsync for one file, syncfs for several)
and acknowledges them; the held reply goes out on the acknowledgement. A sketch of a capture
process (issue 34), to measure what it would give: no failure handling, no metrics, no token mode.
"""

from __future__ import annotations

import asyncio
import os
import runpy
import socket
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import capture._group_commit as group_commit  # noqa: E402
import proxy._capture_writer as capture_writer  # noqa: E402

PARTS = ("none", "barrier", "persistence", "process")
#: A frame to the child: its length, then the call's number, its path's length, the path, the line.
_FRAME, _CALL = struct.Struct("!I"), struct.Struct("!QH")
#: Lines queued on the loop are sent once this many wait (else at the end of the loop's iteration):
#: the child begins to append while the loop works on the calls behind them.
_SEND_AT = 8


def _take_out(part: str) -> None:
    if part == "barrier":
        group_commit.GroupCommitter._barrier = lambda self, pending: None  # type: ignore[method-assign]
    elif part == "persistence":
        def settle_at_once(self, exchange, on_settled):  # type: ignore[no-untyped-def]
            self._loop.call_soon(on_settled, True)
        capture_writer.CaptureWriter.submit = settle_at_once  # type: ignore[method-assign]
    elif part == "process":
        capture_writer.CaptureWriter.submit = _submit_to_child  # type: ignore[method-assign]
    elif part != "none":
        raise SystemExit(f"the part is one of {PARTS}, not {part!r}")


def _append_and_sync(sock: socket.socket, directory: str) -> None:
    """The child: append what came together, make it durable, acknowledge each line's number."""
    from capture._open_files import OpenFiles
    from records import call_syncfs, load_syncfs

    syncfs, directory_fd, files, pending = load_syncfs(), os.open(directory, os.O_RDONLY), OpenFiles(True), b""
    while data := sock.recv(1 << 22):
        pending += data
        numbers, touched = [], []
        while len(pending) >= 4 and len(pending) >= 4 + _FRAME.unpack_from(pending)[0]:
            size = _FRAME.unpack_from(pending)[0]
            number, path_size = _CALL.unpack_from(pending, 4)
            path = pending[4 + _CALL.size:4 + _CALL.size + path_size].decode()
            line = pending[4 + _CALL.size + path_size:4 + size]
            pending = pending[4 + size:]
            touched.append(files.append(path, line)[0])  # The group committer's open files.
            numbers.append(number)
        if numbers:
            if len({file.fd for file in touched}) == 1:
                os.fsync(touched[0].fd)
            else:
                call_syncfs(syncfs, directory_fd)  # type: ignore[arg-type]
            for file in touched:
                files.release(file)
            sock.sendall(b"".join(struct.pack("!Q", number) for number in numbers))


class _Acknowledgements(asyncio.Protocol):
    def __init__(self, waiting: dict) -> None:  # type: ignore[type-arg]
        self.waiting, self.pending = waiting, b""

    def data_received(self, data: bytes) -> None:
        self.pending += data
        whole = len(self.pending) // 8 * 8
        for (number,) in struct.iter_unpack("!Q", self.pending[:whole]):
            self.waiting.pop(number)(True)
        self.pending = self.pending[whole:]


_CHILD: dict = {}  # type: ignore[type-arg]


def _submit_to_child(self, exchange, on_settled):  # type: ignore[no-untyped-def]
    state = _CHILD
    if "waiting" not in state:
        state.update(waiting={}, number=0, queued=[], transport=None, paths={})

        async def connect() -> None:
            state["transport"], _ = await self._loop.connect_accepted_socket(
                lambda: _Acknowledgements(state["waiting"]), state["socket"])
            state["transport"].write(b"".join(state.pop("early", [])))
        state["early"] = []
        self._loop.create_task(connect())
    state["number"] += 1
    state["waiting"][state["number"]] = on_settled
    path = state["paths"].get(exchange.rollout_id) or state["paths"].setdefault(
        exchange.rollout_id, capture_writer.capture_path(self.capture_dir, exchange.rollout_id).encode())
    line = capture_writer.encode_capture_line(exchange.capture_fields())
    queued = state["queued"]
    queued.append(_FRAME.pack(_CALL.size + len(path) + len(line)) + _CALL.pack(state["number"], len(path)) + path + line)

    def send() -> None:
        if queued:
            data = b"".join(queued)
            queued.clear()
            if state["transport"] is None:
                state["early"].append(data)  # Before the loop has taken the socket.
            else:
                state["transport"].write(data)
    if len(queued) >= _SEND_AT:
        send()
    elif len(queued) == 1:
        self._loop.call_soon(send)


def _start_child() -> None:
    """Forked before the sidecar starts (no thread, no loop yet); it ends when the sidecar does."""
    directory = sys.argv[sys.argv.index("--capture-dir") + 1]
    os.makedirs(directory, exist_ok=True)
    parent, child = socket.socketpair()
    if os.fork() == 0:
        parent.close()
        _append_and_sync(child, directory)
        os._exit(0)
    child.close()
    parent.setblocking(False)
    _CHILD["socket"] = parent


if __name__ == "__main__":
    _take_out(sys.argv[1])
    if sys.argv[1] == "process":
        _start_child()
    sys.argv = ["proxy", *sys.argv[2:]]
    runpy.run_module("proxy", run_name="__main__")
