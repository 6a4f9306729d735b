"""Receipts instead of bodies (docs/privacy.md, issue 73): what a run did, shareable without what was
said. Per call: its ids, timings, status, token counts, tool names, sizes in bytes and in tokens,
and keyed digests of the request and the reply -- no text of either.

A digest is HMAC-SHA256 under a key the exporter holds (``MCC_RECEIPT_KEY``, hex, or a key file),
over the request or reply as the line keeps it (JSON with its keys sorted): whoever holds the key
and a body can prove it is the one a receipt names; without the key a digest says nothing of the
text, not even of a short one. Fields are chosen by name (`RECEIPT_FIELDS`), never by excluding
text: a field added to the lines later is not in a receipt until it is added here.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any, Iterator, Optional

import orjson

from records import CaptureStore
from records.store import call_row

#: A receipt's fields, in order, with their Arrow types (the Parquet form's schema).
RECEIPT_FIELDS: tuple[tuple[str, str], ...] = (
    ("rollout_id", "string"), ("call_index", "int64"), ("model_call_id", "string"), ("dialect", "string"),
    ("request_model", "string"), ("response_model", "string"), ("status_code", "int64"),
    ("error_category", "string"), ("finish_reason", "string"), ("response_status", "string"),
    ("started_at", "float64"), ("completed_at", "float64"), ("latency_ms", "float64"), ("ttft_ms", "float64"),
    ("tokens_in", "int64"), ("tokens_out", "int64"), ("cached_tokens", "int64"), ("tokens_reasoning", "int64"),
    ("tool_names", "list<string>"), ("stream", "bool"), ("request_bytes", "int64"), ("response_bytes", "int64"),
    ("request_digest", "string"), ("response_digest", "string"),
)
#: The key's environment variable (hex of 32 bytes or more, as ``MCC_REDACT_KEY``).
KEY_VARIABLE = "MCC_RECEIPT_KEY"


class ReceiptKeyMissing(ValueError):
    """No key, or one that is not hex of 32 bytes or more: said in one sentence."""


def receipt_key(key_file: Optional[str]) -> bytes:
    """The digests' key: from ``key_file`` (its text, hex), else ``MCC_RECEIPT_KEY``; never a flag
    (``ps`` would show it)."""
    if key_file is not None:
        try:
            with open(key_file, encoding="ascii") as handle:
                text = handle.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ReceiptKeyMissing(f"cannot read the receipt key file {key_file}: {exc}") from None
    else:
        text = os.environ.get(KEY_VARIABLE, "").strip()
        if not text:
            raise ReceiptKeyMissing(f"receipts carry keyed digests: set {KEY_VARIABLE} (hex of 32 bytes or more, "
                                    "`openssl rand -hex 32`) or give --receipt-key-file FILE; keep the key to "
                                    "prove a body later")
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 32:
        raise ReceiptKeyMissing("the receipt key must be hex of 32 bytes or more (`openssl rand -hex 32`)")
    return key


def digest(key: bytes, value: Any) -> Optional[str]:
    """The keyed digest of a request or reply as the line keeps it, None when there is none."""
    if value is None:
        return None
    return hmac.new(key, _canonical(value), hashlib.sha256).hexdigest()


def _canonical(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def receipts_of(store: CaptureStore, rollout_id: str, key: bytes) -> Iterator[dict[str, Any]]:
    """The rollout's receipts, one per call, in order."""
    result = store.read_available(rollout_id)
    for index, line in zip(result.call_indexes, result.lines):
        row = call_row(rollout_id, index, line)
        request, response = line.get("request"), line.get("response")
        if response is None:
            response = line.get("response_raw")
        receipt: dict[str, Any] = {name: getattr(row, name, None) for name, _ in RECEIPT_FIELDS}
        receipt.update(
            tool_names=list(row.tool_calls), stream=bool(row.stream),
            request_bytes=len(_canonical(request)) if request is not None else None,
            response_bytes=len(_canonical(response)) if response is not None else None,
            request_digest=digest(key, request), response_digest=digest(key, response))
        yield receipt


__all__ = ["KEY_VARIABLE", "RECEIPT_FIELDS", "ReceiptKeyMissing", "digest", "receipt_key", "receipts_of"]
