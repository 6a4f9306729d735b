"""What a compressed stream costs the capture, and what a decompression bomb costs it.

In process, one core: a vLLM-shaped chat stream (2,000 tokens, a logprob entry and an id on each
chunk) through the tap in 16 KiB reads, plain (the baseline, measured in the same run) and
compressed with each encoding the harnesses advertise; then a 1 GiB bomb of zeros in each encoding,
fed to the capture's decoder in 64 KiB reads, with the peak of what it allocated (tracemalloc) and
the time until it is refused at the bound (`capture.MAX_DECODED_BYTES`).
Usage: python benchmarks/bench_decoding.py [--quick]
"""

from __future__ import annotations

import gzip
import sys
import time
import tracemalloc
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import brotli  # noqa: E402

from capture import MAX_DECODED_BYTES, DecodedTooLarge, StreamTap, make_decoder  # noqa: E402
from tests.codecs import FAST_COMPRESS, zstd  # noqa: E402
from tests.vllm_chat_model import FRAMINGS, chat_payloads, text_tokens  # noqa: E402

#: Realistic levels for the stream (a server's, not the fastest); bombs at the fastest.
CODECS = {
    "gzip": lambda data: gzip.compress(data, compresslevel=6, mtime=0),
    "deflate": zlib.compress,
    "br": lambda data: brotli.compress(data, quality=5),
    "zstd": zstd.compress,
}


def tap_seconds(body: bytes, encoding: str | None, rounds: int) -> float:
    reads = [body[i:i + 16384] for i in range(0, len(body), 16384)]
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        tap = StreamTap("chat", encoding, compact_arrays=True)
        for read in reads:
            tap.feed(read)
        outcome = tap.finish(200)
        best = min(best, time.perf_counter() - started)
        assert outcome.error_category is None, outcome.failure
    return best


def main() -> None:
    quick = "--quick" in sys.argv
    tokens = text_tokens(*(f" w{i}" for i in range(500 if quick else 2000)))
    stream = FRAMINGS["lf"](chat_payloads([tokens], logprobs=True, token_ids=True))
    rounds = 3 if quick else 10
    plain = tap_seconds(stream, None, rounds)
    print(f"## A {len(stream):,}-byte chat stream through the tap, 16 KiB reads (best of {rounds})\n")
    print("| encoding | bytes on the wire | ms | x plain |\n|---|---:|---:|---:|")
    print(f"| identity | {len(stream):,} | {plain * 1000:.2f} | 1.00 |")
    for name, compress in CODECS.items():
        packed = compress(stream)
        took = tap_seconds(packed, name, rounds)
        print(f"| {name} | {len(packed):,} | {took * 1000:.2f} | {took / plain:.2f} |")
    size = (512 << 20) if quick else (1 << 30)  # Above the bound either way.
    print(f"\n## A bomb: {size >> 20} MiB of zeros, refused at {MAX_DECODED_BYTES >> 20} MiB\n")
    print("| encoding | bomb bytes | refused after s | peak allocated MiB |\n|---|---:|---:|---:|")
    zeros = b"\0" * size
    for name, compress in FAST_COMPRESS.items():
        bomb = compress(zeros)
        tracemalloc.start()
        started = time.perf_counter()
        decode = make_decoder(name)
        refused = False
        try:
            for at in range(0, len(bomb), 65536):
                decode(bomb[at:at + 65536])
        except DecodedTooLarge:
            refused = True
        took = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"| {name} | {len(bomb):,} | {took:.2f} | {peak / 2**20:.0f}{'' if refused else ' (not refused!)'} |")


if __name__ == "__main__":
    main()
