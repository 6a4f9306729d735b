"""Compressed replies on request (the stand-in's, for the coding harnesses' wire: issue 44).

A request with ``X-Stand-In-Encoding: gzip | deflate | br | zstd`` whose ``Accept-Encoding`` admits
that coding gets its reply body in it, with ``Content-Encoding``; a stream is compressed event by
event and flushed after each, so it still streams (as a compressing gateway does).
"""

from __future__ import annotations

import zlib
from typing import Any, Callable, Optional

import brotli

try:
    from compression import zstd  # Python 3.14+
except ImportError:
    from backports import zstd

ASK_HEADER = "X-Stand-In-Encoding"


class _Flushing:
    """One body's compressor: `piece` compresses and flushes what it is given; `end` finishes."""

    def __init__(self, compress: Callable[[bytes], bytes], flush: Callable[[], bytes], finish: Callable[[], bytes]) -> None:
        self._compress, self._flush, self._finish = compress, flush, finish

    def piece(self, data: bytes) -> bytes:
        return self._compress(data) + self._flush()

    def end(self) -> bytes:
        return self._finish()


def _zlib(wbits: int) -> _Flushing:
    compressor = zlib.compressobj(wbits=wbits)
    return _Flushing(compressor.compress, lambda: compressor.flush(zlib.Z_SYNC_FLUSH), compressor.flush)


def _brotli() -> _Flushing:
    compressor = brotli.Compressor()
    return _Flushing(compressor.process, compressor.flush, compressor.finish)


def _zstd() -> _Flushing:
    compressor = zstd.ZstdCompressor()
    return _Flushing(compressor.compress, lambda: compressor.flush(zstd.ZstdCompressor.FLUSH_BLOCK),
                     lambda: compressor.flush(zstd.ZstdCompressor.FLUSH_FRAME))


_MAKERS: dict[str, Callable[[], _Flushing]] = {"gzip": lambda: _zlib(31), "deflate": lambda: _zlib(15),
                                               "br": _brotli, "zstd": _zstd}


def asked_encoding(headers: Any) -> Optional[str]:
    """The coding this request asked its reply in, when its Accept-Encoding admits it; else None."""
    asked = (headers.get(ASK_HEADER) or "").strip().lower()
    accepted = {part.split(";")[0].strip().lower() for part in (headers.get("Accept-Encoding") or "").split(",")}
    return asked if asked in _MAKERS and (asked in accepted or "*" in accepted) else None


def compressor(encoding: str) -> _Flushing:
    return _MAKERS[encoding]()


__all__ = ["ASK_HEADER", "asked_encoding", "compressor"]
