"""Content-Encoding decoding for the tap's copy only (docs/wire.md: the client gets the bytes as sent).

Every encoding the field's clients advertise (Claude Code: ``gzip, deflate, br, zstd``; Codex CLI:
``zstd, gzip``): gzip and deflate with the standard library's zlib, br with Google's ``brotli``
bindings, zstd with the standard library's ``compression.zstd`` (Python 3.14, PEP 784) or its
backport ``backports.zstd`` before it. All three let a call ask for at most so many bytes out, so
a decompression bomb is stopped at `MAX_DECODED_BYTES` without allocating past it: the decoder
raises `DecodedTooLarge`, which the tap records as a capture failure; the reply is untouched.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable

Decoder = Callable[[bytes], bytes]

#: The most a body decodes to for the capture: far above a model reply (a 32k-token stream with
#: logprobs is ~10 MB), far below what would hurt the sidecar.
MAX_DECODED_BYTES = 256 * 1024 * 1024
#: Output asked of a codec per call: its buffers never grow past this, whatever the ratio.
_STEP = 4 * 1024 * 1024


class UnsupportedContentEncoding(ValueError):
    """The tap cannot decode this Content-Encoding (the bytes are still forwarded unchanged)."""


class DecodedTooLarge(ValueError):
    """The body decodes to more than the bound: a decompression bomb, or a body no model sends."""


#: Each encoding the capture decodes, and how to make its codec.
_CODECS: dict[str, Callable[[], Any]] = {
    "gzip": lambda: _Zlib(16 + zlib.MAX_WBITS),
    "x-gzip": lambda: _Zlib(16 + zlib.MAX_WBITS),
    "deflate": lambda: _Zlib(None),
    "br": lambda: _Brotli(),
    "zstd": lambda: _Zstd(),
}


def make_decoder(content_encoding: str | None, limit: int = MAX_DECODED_BYTES) -> Decoder:
    """An incremental decoder for ``gzip``, ``deflate``, ``br``, ``zstd`` or identity, whose total
    output is bounded by ``limit``; raise `UnsupportedContentEncoding` for anything else."""
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return _identity
    codec = _CODECS.get(encoding)
    if codec is None:
        raise UnsupportedContentEncoding(f"cannot decode Content-Encoding {content_encoding!r}")
    return _Bounded(codec(), limit)


def decodable(content_encoding: str | None) -> bool:
    """Whether `make_decoder` takes this Content-Encoding."""
    encoding = (content_encoding or "").strip().lower()
    return encoding in ("", "identity") or encoding in _CODECS


def as_evidence(content_encoding: str | None, body: bytes) -> str:
    """A body nobody can decode, for ``request_raw`` / ``response_raw``: its bytes in base64 after
    a note saying so (never its bytes read as UTF-8, which would lose them)."""
    import base64

    return (f"(Content-Encoding {content_encoding!r} cannot be decoded: the body's bytes, base64) "
            + base64.b64encode(body).decode("ascii"))


def _identity(data: bytes) -> bytes:
    return data


class _Bounded:
    """A codec's output, at most ``limit`` bytes in all: each call asks it for one byte more than
    is left, so going past the bound is seen without producing more than that."""

    def __init__(self, codec: Any, limit: int) -> None:
        self._codec = codec
        self._limit = limit
        self._total = 0

    def __call__(self, data: bytes) -> bytes:
        pieces = self._codec.decode(data, self._limit - self._total + 1)
        self._total += sum(map(len, pieces))
        if self._total > self._limit:  # Before the pieces are joined: nothing is allocated past the bound.
            raise DecodedTooLarge(f"the body decodes to more than {self._limit:,} bytes (a decompression bomb?)")
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


class _Zlib:
    """gzip, or RFC 9110 'deflate', which is zlib-wrapped, though some servers send raw deflate:
    ``wbits`` None reads the first two bytes to tell (a zlib header, big-endian, is a multiple of 31)."""

    def __init__(self, wbits: int | None) -> None:
        self._inner = zlib.decompressobj(wbits) if wbits is not None else None
        self._first = b""

    def decode(self, data: bytes, most: int) -> list[bytes]:
        if self._inner is None:
            self._first += data
            if len(self._first) < 2:
                return []
            wbits = zlib.MAX_WBITS if int.from_bytes(self._first[:2], "big") % 31 == 0 else -zlib.MAX_WBITS
            self._inner = zlib.decompressobj(wbits)
            data, self._first = self._first, b""
        inner = self._inner
        pieces = [inner.decompress(data, min(most, _STEP))]
        size = len(pieces[0])
        while inner.unconsumed_tail and size < most:
            pieces.append(inner.decompress(inner.unconsumed_tail, min(most - size, _STEP)))
            size += len(pieces[-1])
        return pieces


class _Brotli:
    def __init__(self) -> None:
        import brotli  # Only where a br body comes.

        self._inner = brotli.Decompressor()

    def decode(self, data: bytes, most: int) -> list[bytes]:
        inner = self._inner
        pieces = [inner.process(data, output_buffer_limit=min(most, _STEP))]
        size = len(pieces[0])
        while size < most and not inner.can_accept_more_data() and not inner.is_finished():
            pieces.append(inner.process(b"", output_buffer_limit=min(most - size, _STEP)))
            size += len(pieces[-1])
            if not pieces[-1]:
                break
        return pieces


def _zstd_decompressor() -> Any:
    try:
        from compression.zstd import ZstdDecompressor  # Python 3.14+
    except ImportError:
        from backports.zstd import ZstdDecompressor
    return ZstdDecompressor()


class _Zstd:
    """One decompressor per frame: a body may hold several frames, one after the other."""

    def __init__(self) -> None:
        self._inner = _zstd_decompressor()

    def decode(self, data: bytes, most: int) -> list[bytes]:
        pieces = []
        size = 0
        while size < most:
            inner = self._inner
            piece = inner.decompress(data, min(most - size, _STEP))
            data = b""
            pieces.append(piece)
            size += len(piece)
            if not piece and not inner.eof:
                break
            if inner.eof:
                rest = inner.unused_data
                self._inner = _zstd_decompressor()
                if not rest:
                    break
                data = rest
            elif inner.needs_input:
                break
        return pieces
