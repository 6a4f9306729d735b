"""Header handling of the proxy: hop-by-hop stripping (RFC 9110 §7.6.1) and correlation values."""

from __future__ import annotations

from typing import Iterable

from multidict import CIMultiDict, CIMultiDictProxy

# RFC 9110 §7.6.1 plus the legacy names every proxy strips; Host is replaced by the upstream's,
# Content-Length is recomputed by the HTTP library from the body it sends.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_REQUEST_ONLY_DROPPED = frozenset({"host", "content-length", "expect"})


def _connection_tokens(values: Iterable[str]) -> set[str]:
    """Header names listed in Connection are hop-by-hop for this message too."""
    return {token.strip().lower() for value in values for token in value.split(",") if token.strip()}


def upstream_request_headers(incoming: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """The client's end-to-end request headers, to send upstream."""
    dropped = _HOP_BY_HOP | _REQUEST_ONLY_DROPPED | _connection_tokens(incoming.getall("Connection", []))
    return CIMultiDict((name, value) for name, value in incoming.items() if name.lower() not in dropped)


def client_response_headers(raw_headers: Iterable[tuple[bytes, bytes]]) -> CIMultiDict[str]:
    """The upstream's end-to-end response headers, names in the case and order they arrived."""
    pairs = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in raw_headers]
    connection = [value for name, value in pairs if name.lower() == "connection"]
    dropped = _HOP_BY_HOP | _connection_tokens(connection)
    # Content-Length stays: the body is forwarded unchanged, so the upstream's length is right.
    return CIMultiDict((name, value) for name, value in pairs if name.lower() not in dropped)


def single_value(headers: CIMultiDictProxy[str], name: str) -> str | None:
    """The header's value when exactly one distinct non-empty value is present (DESIGN §2)."""
    values = {value.strip() for value in headers.getall(name, []) if value.strip()}
    return values.pop() if len(values) == 1 else None
