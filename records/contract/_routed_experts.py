"""MoE routed experts of a call (docs/tokens.md, "Routed experts"): the array an engine returns, one
row per token it read, stored apart from the JSON lines as its own object named by its sha256.

vLLM (``--enable-return-routed-experts``) returns each choice's ``routed_experts`` as base64 of a
``.npy`` file, shape ``(tokens - 1, layers, top_k)``, dtype ``uint8`` (256 experts or fewer) or
``uint16``: a row per token of the sequence from the request's ``routed_experts_prompt_start`` on,
but the last (never read back: it was sampled, not forwarded). Row ``i`` of a stored array is the
routing of token ``start + i`` of the call's whole sequence.

Pure Python: the ``.npy`` format (version 1.0 to 3.0, C order, little-endian or byte-sized
integers) is read and written here; ``to_numpy`` gives a NumPy view where NumPy is installed.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import os
import struct
from dataclasses import dataclass
from typing import Any, Optional

from ._appender import fsync_directory
from ._errors import RecordsError

#: A rollout's routed-expert objects, beside its token files: ``<rollout_id>.experts/<sha256>.npy``.
EXPERTS_SUFFIX = ".experts"
#: In a capture store (docs/files.md): ``experts/<sha256>.npy``, shared by every rollout (content-named).
EXPERT_OBJECTS = "experts"
#: Gym's sentinel for a token whose routing is unknown (``staging/routes.py``: MISSING_ROUTE_SENTINEL).
MISSING_ROUTE = -1
_MAGIC = b"\x93NUMPY"
#: Integer dtypes an engine writes, by ``.npy`` descr: (struct format, item size).
_DTYPES = {"|u1": ("B", 1), "|i1": ("b", 1), "<u2": ("H", 2), "<i2": ("h", 2), "<i4": ("i", 4), "<u4": ("I", 4),
           "<i8": ("q", 8)}


class RoutedExpertsProblem(RecordsError):
    """Routed experts that cannot be read as what their reference says (bytes, digest, shape)."""


@dataclass(frozen=True)
class RoutedExperts:
    """Rows of routed experts: ``shape`` ``(rows, layers, top_k)`` of ``dtype`` (a ``.npy`` descr),
    ``data`` in C order; row ``i`` is the routing of token ``start + i`` of the sequence."""

    dtype: str
    shape: tuple[int, int, int]
    data: bytes
    start: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise RoutedExpertsProblem(f"routed experts of dtype {self.dtype!r}: an integer dtype is expected")
        if len(self.shape) != 3 or any(type(side) is not int or side < 0 for side in self.shape):
            raise RoutedExpertsProblem(f"routed experts of shape {self.shape!r}: (tokens, layers, top_k) is expected")
        if len(self.data) != self.shape[0] * self.row_bytes:
            raise RoutedExpertsProblem(f"routed experts of shape {self.shape} hold {len(self.data)} bytes, "
                                       f"not {self.shape[0] * self.row_bytes}")

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def row_bytes(self) -> int:
        return self.shape[1] * self.shape[2] * _DTYPES[self.dtype][1]

    @classmethod
    def from_npy(cls, blob: bytes, start: int = 0) -> "RoutedExperts":
        """An array from its ``.npy`` bytes (`RoutedExpertsProblem` when they are not one we read)."""
        if not blob.startswith(_MAGIC) or len(blob) < 10:
            raise RoutedExpertsProblem("not a .npy array")
        major = blob[6]
        if major == 1:
            (length,), offset = struct.unpack_from("<H", blob, 8), 10
        elif major in (2, 3):
            (length,), offset = struct.unpack_from("<I", blob, 8), 12
        else:
            raise RoutedExpertsProblem(f".npy version {major} is not one this reader knows")
        try:
            header = ast.literal_eval(blob[offset:offset + length].decode("latin-1"))
        except (ValueError, SyntaxError) as exc:
            raise RoutedExpertsProblem(f"the .npy header cannot be read: {exc}") from None
        if not isinstance(header, dict) or header.get("fortran_order") is not False:
            raise RoutedExpertsProblem("a .npy array in C order is expected")
        descr, shape = header.get("descr"), header.get("shape")
        if descr == "<u1" or descr == "<i1":
            descr = "|" + descr[1:]
        if not isinstance(shape, tuple) or len(shape) != 3:
            raise RoutedExpertsProblem(f"routed experts of shape {shape!r}: (tokens, layers, top_k) is expected")
        return cls(str(descr), (shape[0], shape[1], shape[2]), bytes(blob[offset + length:]), start)

    @classmethod
    def from_base64(cls, text: str, start: int = 0) -> "RoutedExperts":
        """What vLLM writes in a reply (``numpy2base64``)."""
        try:
            blob = base64.b64decode(text, validate=True)
        except ValueError as exc:
            raise RoutedExpertsProblem(f"routed experts are not base64: {exc}") from None
        return cls.from_npy(blob, start)

    def to_npy(self) -> bytes:
        """The ``.npy`` (version 1.0) bytes, as ``numpy.save`` writes them."""
        header = f"{{'descr': '{self.dtype}', 'fortran_order': False, 'shape': {self.shape}, }}"
        padding = 64 - (len(_MAGIC) + 4 + len(header) + 1) % 64
        encoded = (header + " " * (padding % 64) + "\n").encode("latin-1")
        return _MAGIC + b"\x01\x00" + struct.pack("<H", len(encoded)) + encoded + self.data

    def from_row(self, row: int) -> "RoutedExperts":
        """Rows ``row`` on (a contiguous byte range: C order)."""
        row = max(0, min(row, self.rows))
        return RoutedExperts(self.dtype, (self.rows - row, *self.shape[1:]), self.data[row * self.row_bytes:],
                             self.start + row)

    def tolist(self) -> list[list[list[int]]]:
        """Nested lists ``[token][layer][k]`` (Gym's legacy form; NumPy's ``tolist`` of `to_numpy`)."""
        code, _ = _DTYPES[self.dtype]
        rows, layers, top_k = self.shape
        flat = struct.unpack(f"<{rows * layers * top_k}{code}", self.data)
        width = layers * top_k
        return [[list(flat[r * width + l * top_k:r * width + (l + 1) * top_k]) for l in range(layers)]  # noqa: E741
                for r in range(rows)]

    def to_numpy(self) -> Any:
        """A read-only NumPy array of ``shape`` (NumPy imported here: `records` does not need it)."""
        import numpy

        return numpy.frombuffer(self.data, dtype=numpy.dtype(self.dtype)).reshape(self.shape)


def routed_experts_reference(stored: RoutedExperts, sha256: str) -> dict[str, Any]:
    """What a token entry's ``routed_experts`` holds: the object's digest, and what it holds."""
    return {"sha256": sha256, "dtype": stored.dtype, "shape": list(stored.shape), "start": stored.start}


def experts_path(token_dir: str, rollout_id: str, sha256: str) -> str:
    return os.path.join(token_dir, rollout_id + EXPERTS_SUFFIX, sha256 + ".npy")


def expert_object_name(sha256: str) -> str:
    return f"{EXPERT_OBJECTS}/{sha256}.npy"


def write_routed_experts(token_dir: str, rollout_id: str, stored: RoutedExperts) -> dict[str, Any]:
    """Store a call's rows as their own object, durable before this returns (its entry names it,
    so it must be on disk first); the same rows again are the same object. The reference."""
    blob = stored.to_npy()
    sha256 = hashlib.sha256(blob).hexdigest()
    path = experts_path(token_dir, rollout_id, sha256)
    if not os.path.exists(path):
        directory = os.path.dirname(path)
        created = not os.path.isdir(directory)
        os.makedirs(directory, exist_ok=True)
        part = f"{path}.{os.getpid()}.part"
        with open(part, "wb") as handle:
            handle.write(blob)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(part, path)
        fsync_directory(directory)
        if created:
            fsync_directory(token_dir)
    return routed_experts_reference(stored, sha256)


def load_routed_experts(blob: bytes, reference: Any) -> RoutedExperts:
    """The rows a reference names, from the object's bytes: verified by digest, dtype and shape."""
    if not isinstance(reference, dict) or not isinstance(reference.get("sha256"), str):
        raise RoutedExpertsProblem(f"not a routed-experts reference: {reference!r}")
    digest = hashlib.sha256(blob).hexdigest()
    if digest != reference["sha256"]:
        raise RoutedExpertsProblem(f"routed experts object {reference['sha256']} has the digest {digest}")
    start = reference.get("start")
    stored = RoutedExperts.from_npy(blob, start if type(start) is int else 0)
    if [stored.dtype, list(stored.shape)] != [reference.get("dtype"), reference.get("shape")]:
        raise RoutedExpertsProblem(f"routed experts object {digest} holds {stored.dtype} {stored.shape}, its reference "
                                   f"says {reference.get('dtype')} {reference.get('shape')}")
    return stored


def aligned_routed_experts(parts: list[Optional[RoutedExperts]], tokens: int) -> Optional[RoutedExperts]:
    """One array for a sequence of ``tokens`` from the rows of its calls (each placed at its
    ``start``): ``tokens - 1`` rows (the last token is never read back). Rows no part covers hold
    `MISSING_ROUTE`, as Gym fills them, in a signed dtype wide enough; None when no part has rows."""
    present = [part for part in parts if part is not None and part.rows]
    if not present or tokens < 2:
        return None
    layers, top_k = present[0].shape[1:]
    if any(part.shape[1:] != (layers, top_k) for part in present):
        raise RoutedExpertsProblem("the calls' routed experts disagree on layers or top_k")
    rows = tokens - 1
    covered = bytearray(rows)
    for part in present:
        first, last = max(0, part.start), min(rows, part.start + part.rows)
        if first < last:
            covered[first:last] = b"\x01" * (last - first)
    dtypes = {part.dtype for part in present}
    whole = all(covered) and len(dtypes) == 1
    dtype = present[0].dtype if whole else "<i4"
    code, size = _DTYPES[dtype]
    width = layers * top_k
    if whole:
        data = bytearray(rows * width * size)
    else:
        data = bytearray(struct.pack(f"<{rows * width}i", *([MISSING_ROUTE] * (rows * width))))
    for part in present:
        first, last = max(0, part.start), min(rows, part.start + part.rows)
        if first >= last:
            continue
        source = part.from_row(first - part.start)
        if dtype == part.dtype:
            chunk = source.data[:(last - first) * part.row_bytes]
        else:
            values = struct.unpack(f"<{(last - first) * width}{_DTYPES[part.dtype][0]}",
                                   source.data[:(last - first) * part.row_bytes])
            chunk = struct.pack(f"<{len(values)}{code}", *values)
        data[first * width * size:last * width * size] = chunk
    return RoutedExperts(dtype, (rows, layers, top_k), bytes(data), 0)
