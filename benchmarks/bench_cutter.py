"""The token capture mode's cut costs the same per byte at any read size (issue 30, point 2).

In process, one core: a vLLM-shaped chat stream (2,000 tokens, a logprob entry and an id on each
chunk) and one 1.2 MB chunk (a long token with its logprob entry) fed to the tap in reads of
64 KiB down to 64 bytes, with the cutter (capture + cut, as `--capture-tokens` runs it) and
without (the capture alone, the baseline measured in the same run). Prints µs per KiB and each
read size's cost relative to 64 KiB reads: flat means linear; a cost growing as reads shrink is
a quadratic buffer. Usage: python benchmarks/bench_cutter.py [--quick]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from capture import AddedFieldCutter, CuttingStreamTap, StreamTap  # noqa: E402
from tests.vllm_chat_model import FRAMINGS, Token, chat_payloads, text_tokens  # noqa: E402

READ_SIZES = (65536, 16384, 4096, 1460, 256, 64)
ADDED = {"logprobs": True, "return_token_ids": True}
REQUEST = {"model": "m", "messages": [], "stream": True}


def streams(quick: bool) -> dict[str, bytes]:
    tokens = text_tokens(*(f" w{i}" for i in range(500 if quick else 2000)))
    long_token = Token(5, "x" * 600_000, -0.5, {"content": "x" * 600_000})
    return {
        f"{len(tokens):,} tokens, one chunk each": FRAMINGS["lf"](chat_payloads([tokens], logprobs=True, token_ids=True)),
        "one 1.2 MB chunk": FRAMINGS["lf"](chat_payloads([[*text_tokens("a"), long_token]], logprobs=True, token_ids=True)),
    }


def seconds(body: bytes, read_size: int, cut: bool, rounds: int) -> float:
    reads = [body[i:i + read_size] for i in range(0, len(body), read_size)]
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        tap = CuttingStreamTap("chat", cutter=AddedFieldCutter("chat", ADDED, REQUEST)) if cut else StreamTap("chat")
        for read in reads:
            tap.feed(read)
            if cut:
                tap.take_output()
        if cut:
            tap.close_output()
        tap.finish(200)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    quick = "--quick" in sys.argv
    rounds = 2 if quick else 5
    print(f"# The cut's cost per byte by read size (one core, Python {sys.version.split()[0]}, best of {rounds})\n")
    print("| stream | read size | capture alone, µs/KiB | capture + cut, µs/KiB | cut vs alone | capture + cut vs 64 KiB reads |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, body in streams(quick).items():
        kib = len(body) / 1024
        base = None
        for read_size in READ_SIZES:
            alone = seconds(body, read_size, False, rounds)
            both = seconds(body, read_size, True, rounds)
            base = base or both
            print(f"| {name} | {read_size:,} | {alone / kib * 1e6:.2f} | {both / kib * 1e6:.2f} | {both / alone:.2f}x "
                  f"| {both / base:.2f}x |")


if __name__ == "__main__":
    main()
