"""What one streamed event costs the sidecar's event loop, by part (issue 55).

    python benchmarks/bench_events.py [--seconds 8] [--rounds 2]

A vLLM-shaped logprob stream (256 events a reply, a logprob entry and a token id in every chunk,
about 80 KB written whole at once by `fast_upstream.py`) read by wrk at c=64 through one sidecar,
with capture on and in the token capture mode, in turn. During each run the sidecar's process is
sampled by py-spy (a sampling profiler: it does not slow the code it watches) and its CPU time is
read from /proc; each sample is given to the part its innermost frame of this project belongs to:

- pump: the wire and the call (proxy/http, proxy/call's pump and phases, the event loop itself);
- parse: framing the SSE events and reading their values (capture/_sse.py, the tap, the event
  templates);
- reassemble: folding them into the reply (the dialect's reassembler);
- cut: the token capture mode's cut (capture/_token_cutter.py, _json_spans.py);
- line: making the line and handing it to the journal (the exchange's fields, capture/journal,
  records' encoder, the token mode's entry).

µs per event = the part's share of the samples x the process's CPU seconds / events delivered.
Then the same stream through `--workers 2` against one worker, interleaved (events/s each).
Only the event loop's thread is counted by part: the sidecar's other threads (the token mode's
writer threads: its intents and lines) and the capture process (which appends the lines with
capture on) are printed apart, µs of CPU per event each.
Nothing is asserted; figures compare only within one run.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_proxy as bench  # noqa: E402

PARTS = ("pump", "parse", "reassemble", "cut", "line")
MODES = {"capture on": (), "token mode": ("--capture-tokens", "--capture-raw-stream", "on-failure")}
_PART_OF_FILE = (
    ("capture/_token_cutter.py", "cut"), ("capture/_json_spans.py", "cut"),
    ("capture/_chat.py", "reassemble"), ("capture/_reassembler.py", "reassemble"), ("capture/_completions.py", "reassemble"),
    ("capture/_messages.py", "reassemble"), ("capture/_responses.py", "reassemble"),
    ("capture/_sse.py", "parse"), ("capture/_event_templates.py", "parse"), ("capture/_tap.py", "parse"),
    ("capture/journal/", "line"), ("records/", "line"), ("proxy/call/_exchange.py", "line"), ("proxy/call/_line.py", "line"),
    ("proxy/training/", "line"),
)


def part_of(stack: str) -> str:
    """The part of the innermost frame of this project in a py-spy stack (outermost first)."""
    for frame in reversed(stack.split(";")):
        location = frame.rpartition("(")[2]
        for fragment, part in _PART_OF_FILE:
            if fragment in location:
                return part
        if "proxy/" in location:
            return "pump"
    return "pump"  # The event loop's own frames (uvloop, asyncio): the wire.


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """A process's CPU seconds (all its threads), or one thread's."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    with open(path, encoding="ascii") as handle:
        fields = handle.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(child) for child in out]


def ensure_py_spy() -> str:
    found = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(found):
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "py-spy"], check=True)
    return found


def measure(py_spy: str, upstream: bench.Target, mode: str, seconds: int, workdir: str) -> dict[str, float]:
    capture_dir = tempfile.mkdtemp(prefix="mcc-events-")
    target = bench.start_sidecar(mode, upstream, capture_dir, extra=MODES[mode])
    try:
        script = bench.wrk_post_script(workdir, bench.LOGPROB_BODY)
        bench.wrk_rps(target.port, 64, 1, workdir, bench.LOGPROB_BODY)  # Warm.
        wrk = subprocess.Popen(["wrk", "-t2", "-c64", f"-d{seconds + 2}s", "-s", script, f"http://127.0.0.1:{target.port}/"],
                               stdout=subprocess.PIPE, text=True)
        time.sleep(1)
        pid = target.process.pid  # type: ignore[union-attr]
        helpers = children(pid)
        cpu_before, loop_before = cpu_seconds(pid), cpu_seconds(pid, pid)
        helpers_before = sum(map(cpu_seconds, helpers))
        raw = os.path.join(workdir, "samples.txt")
        started = time.perf_counter()
        subprocess.run([py_spy, "record", "-p", str(pid), "-d", str(seconds), "-r", "250", "-f", "raw", "-o", raw,
                        "--nonblocking", "--threads"], capture_output=True, check=True)
        window = time.perf_counter() - started
        cpu = cpu_seconds(pid, pid) - loop_before  # The event loop's thread (the process's first).
        threads_cpu = cpu_seconds(pid) - cpu_before - cpu
        helpers_cpu = sum(map(cpu_seconds, helpers)) - helpers_before
        out = wrk.communicate()[0]
        rps = float(next(line.split()[1] for line in out.splitlines() if line.startswith("Requests/sec")))
    finally:
        target.stop()
        shutil.rmtree(capture_dir, ignore_errors=True)
    samples: collections.Counter[str] = collections.Counter()
    with open(raw, encoding="utf-8") as handle:
        for line in handle:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if "proxy/__main__.py" in stack:  # The event loop's thread; writer threads apart.
                samples[part_of(stack)] += int(count)
    total = sum(samples.values()) or 1
    events = rps * bench.STREAM_EVENTS * window
    figures = {part: samples[part] / total * cpu / events * 1e6 for part in PARTS}
    figures["events/s"] = rps * bench.STREAM_EVENTS
    figures["loop"] = cpu / events * 1e6
    figures["process"] = (cpu + threads_cpu) / events * 1e6
    figures["capture process"] = helpers_cpu / events * 1e6
    figures["threads"] = threads_cpu / events * 1e6
    return figures


def workers_events(upstream: bench.Target, mode: str, workers: int, seconds: int, workdir: str) -> float:
    """Events/s of the logprob stream through a sidecar of ``workers`` processes (wrk, c=64)."""
    capture_dir = tempfile.mkdtemp(prefix="mcc-events-")
    target = bench.start_sidecar(mode, upstream, capture_dir, workers=workers, extra=MODES[mode])
    try:
        return bench.wrk_events(target.port, 64, seconds, workdir, bench.LOGPROB_BODY)
    finally:
        target.stop()
        shutil.rmtree(capture_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    bench.ensure_tools()
    py_spy = ensure_py_spy()
    workdir = tempfile.mkdtemp(prefix="mcc-events-work-")
    upstream = bench.start_upstream()
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    scaling: dict[tuple[str, int], list[float]] = {}
    try:
        for _ in range(args.rounds):
            for mode in MODES:
                runs[mode].append(measure(py_spy, upstream, mode, args.seconds, workdir))
            for mode in MODES:
                for workers in (1, 2):
                    scaling.setdefault((mode, workers), []).append(
                        workers_events(upstream, mode, workers, args.seconds, workdir))
    finally:
        upstream.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"# Event-loop CPU per streamed event, by part (logprob stream, wrk c=64, {args.rounds} rounds of "
          f"{args.seconds} s, medians)\n")
    print("| mode | events/s | " + " | ".join(f"{part} (µs)" for part in PARTS)
          + " | loop, all (µs) | the sidecar's other threads (µs) | capture process (µs) |")
    print("|---|---:|" + "---:|" * (len(PARTS) + 3))
    for mode, figures in runs.items():
        def median(key: str, figures: list = figures) -> float:
            values = sorted(run[key] for run in figures)
            return values[len(values) // 2]
        print(f"| {mode} | {median('events/s'):,.0f} | " + " | ".join(f"{median(part):.2f}" for part in PARTS)
              + f" | {median('loop'):.2f} | {median('threads'):.2f} | {median('capture process'):.2f} |")
    print(f"\n# --workers 2 against one worker on the same stream (wrk c=64, {args.rounds} interleaved rounds, medians)\n")
    print("| mode | 1 worker, events/s | 2 workers, events/s | 2 / 1 |")
    print("|---|---:|---:|---:|")
    for mode in MODES:
        one, two = (sorted(scaling[(mode, n)])[len(scaling[(mode, n)]) // 2] for n in (1, 2))
        print(f"| {mode} | {one:,.0f} | {two:,.0f} | {two / one:.2f} |")


if __name__ == "__main__":
    main()
