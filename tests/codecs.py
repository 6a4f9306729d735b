"""The codecs of every Content-Encoding the capture decodes, to make compressed bodies with (the
tests and `benchmarks/bench_decoding.py`)."""

from __future__ import annotations

import gzip
import zlib

import brotli

try:
    from compression import zstd  # type: ignore[import-not-found]  # Python 3.14+
except ImportError:
    from backports import zstd

#: Each encoding's compressor at its default settings.
COMPRESS = {
    "gzip": lambda data: gzip.compress(data, mtime=0),
    "deflate": zlib.compress,
    "br": brotli.compress,
    "zstd": zstd.compress,
}
#: The same codecs at their fastest settings (a bomb is made of zeros: any level shrinks it).
FAST_COMPRESS = {
    "gzip": lambda data: gzip.compress(data, compresslevel=1, mtime=0),
    "deflate": lambda data: zlib.compress(data, 1),
    "br": lambda data: brotli.compress(data, quality=0),
    "zstd": lambda data: zstd.compress(data, 1),
}

__all__ = ["COMPRESS", "FAST_COMPRESS", "zstd"]
