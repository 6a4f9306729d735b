"""Content-Encoding decoding for the tap's copy only (DESIGN §2: the client gets the bytes as sent)."""

from __future__ import annotations

import zlib
from typing import Callable

Decoder = Callable[[bytes], bytes]


class UnsupportedContentEncoding(ValueError):
    """The tap cannot decode this Content-Encoding (the bytes are still forwarded unchanged)."""


def make_decoder(content_encoding: str | None) -> Decoder:
    """An incremental decoder for ``gzip``, ``deflate`` or identity; raise for anything else."""
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return _identity
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress
    if encoding == "deflate":
        return _DeflateDecoder().decompress
    raise UnsupportedContentEncoding(f"cannot decode Content-Encoding {content_encoding!r}")


def _identity(data: bytes) -> bytes:
    return data


class _DeflateDecoder:
    """RFC 9110 'deflate' is zlib-wrapped, but some servers send raw deflate: accept both."""

    def __init__(self) -> None:
        self._inner: zlib._Decompress | None = None
        self._first = b""

    def decompress(self, data: bytes) -> bytes:
        if self._inner is None:
            self._first += data
            if len(self._first) < 2:
                return b""
            # A zlib header's first two bytes, read big-endian, are a multiple of 31.
            wbits = zlib.MAX_WBITS if int.from_bytes(self._first[:2], "big") % 31 == 0 else -zlib.MAX_WBITS
            self._inner = zlib.decompressobj(wbits)
            data, self._first = self._first, b""
        return self._inner.decompress(data)
