"""The sidecar as a real subprocess (`python -m proxy serve`), for crash, multi-writer and soak tests."""

from __future__ import annotations

import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import IO

# A child's pipe is read by one pump thread into a queue, so a test waits for a line with a
# deadline and fails with a message instead of blocking forever in readline() (issue 21, point 1).
_pumps: "weakref.WeakKeyDictionary[IO[str], queue.Queue[str]]" = weakref.WeakKeyDictionary()


def read_line(pipe: IO[str] | None, timeout: float = 30.0) -> str:
    """The next line of a child's text pipe ('' at its end); AssertionError if none comes in time.

    Once a pipe is read here, read it only here (the pump thread owns it)."""
    assert pipe is not None, "the child's pipe was not opened (stdout=subprocess.PIPE)"
    lines = _pumps.get(pipe)
    if lines is None:
        lines = _pumps[pipe] = queue.Queue()
        threading.Thread(target=_pump, args=(pipe, lines), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no line from the child within {timeout:g} s") from None


def _pump(pipe: IO[str], lines: "queue.Queue[str]") -> None:
    try:
        for line in pipe:
            lines.put(line)
    except ValueError:  # The pipe was closed under us (the test is over).
        pass
    lines.put("")


@dataclass
class SidecarProcess:
    process: subprocess.Popen
    url: str
    stderr_lines: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, *args: str, env: dict[str, str] | None = None, file_size_limit: int | None = None) -> "SidecarProcess":
        """Start ``mcc serve --port 0 ARGS`` and wait for its ready line."""
        def limit_file_size() -> None:
            # A full filesystem as the sidecar sees it: writes past the limit fail with EFBIG
            # (SIGXFSZ ignored, so the process is not killed by it).
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))  # type: ignore[arg-type]

        process = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--port", "0", *args],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**os.environ, **(env or {})},
                                   preexec_fn=limit_file_size if file_size_limit is not None else None)
        try:
            line = read_line(process.stdout, timeout=60)
        except AssertionError:
            line = "(nothing within 60 s)"
        if not line.startswith("listening on "):
            process.kill()
            raise RuntimeError(f"the sidecar did not start: {line!r} {process.stderr.read()}")  # type: ignore[union-attr]
        sidecar = cls(process, line.split()[-1])
        threading.Thread(target=sidecar._drain_stderr, daemon=True).start()
        return sidecar

    def _drain_stderr(self) -> None:
        for line in self.process.stderr:  # type: ignore[union-attr]
            self.stderr_lines.append(line)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def terminate(self, timeout: float = 60) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.process.pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))


#: A one-message chat request, the body the process-level tests send through the sidecar.
CHAT_HI = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


def post_chat(base_url: str, rollout_id: str, *, close: bool = False, timeout: float = 30) -> tuple[int, bytes]:
    """POST `CHAT_HI` to ``base_url``'s chat endpoint under ``rollout_id``; (status, body)."""
    import urllib.request

    request = urllib.request.Request(f"{base_url}/ng-rollout/{rollout_id}/v1/chat/completions", method="POST",
                                     data=CHAT_HI, headers={"Connection": "close"} if close else {})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return reply.status, reply.read()
