"""Headers on the wire: the one `Headers` type, hop-by-hop stripping (RFC 9110 §7.6.1), single values."""

from __future__ import annotations

from typing import Iterable, Optional


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


#: A head's fields as they came, in order, names and values as bytes (the one type of the wire).
Headers = list[tuple[bytes, bytes]]


def header_value(headers: Headers, name: bytes) -> Optional[bytes]:
    """The value of the first field named ``name`` (lower case), else None."""
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def first_values(headers: Headers) -> dict[bytes, bytes]:
    """The first value of each field by its lower-case name (what `header_value` finds), for heads
    not gathered as they were parsed (`ServerRequest.fields`, `UpstreamReply.fields`)."""
    return {name.lower(): value for name, value in reversed(headers)}


def _connection_tokens(values: Iterable[bytes]) -> set[bytes]:
    """Header names listed in Connection are hop-by-hop for this message too."""
    return {token.strip().lower() for value in values for token in value.split(b",") if token.strip()}


def _end_to_end(headers: Headers, dropped: frozenset[bytes], fields: Optional[dict[bytes, bytes]]) -> Headers:
    if fields is None or b"connection" in fields:  # ``fields``: the head's names, lower case (no scan).
        connection = [value for name, value in headers if name.lower() == b"connection"]
        if connection:
            dropped = dropped | _connection_tokens(connection)
    return [(name, value) for name, value in headers if name.lower() not in dropped]


def upstream_request_headers(incoming: Headers, fields: Optional[dict[bytes, bytes]] = None) -> Headers:
    """The client's end-to-end request headers, to send upstream (Host and Content-Length are the
    pool's). ``fields``: the head's fields by lower-case name (`ServerRequest.fields`), if known."""
    return _end_to_end(incoming, _REQUEST_DROPPED, fields)


def client_response_headers(raw_headers: Headers, fields: Optional[dict[bytes, bytes]] = None) -> Headers:
    """The upstream's end-to-end response headers, names in the case and order they arrived.

    Content-Length stays: the body is forwarded unchanged, so the upstream's length is right.
    """
    return _end_to_end(raw_headers, _HOP_BY_HOP_NAMES, fields)


def single_value(headers: Headers, name: str, fields: Optional[dict[bytes, bytes]] = None) -> str | None:
    """The header's value when exactly one distinct non-empty value is present (docs/wire.md).
    ``fields``: the head's fields by lower-case name, to tell an absent header without a scan."""
    wanted = name.lower().encode("latin-1")
    if fields is not None and wanted not in fields:
        return None
    values = {value.decode("latin-1").strip() for key, value in headers if key.lower() == wanted}
    values.discard("")
    return values.pop() if len(values) == 1 else None


_HOP_BY_HOP_NAMES = frozenset(name.encode() for name in _HOP_BY_HOP)
_REQUEST_DROPPED = frozenset(name.encode() for name in _HOP_BY_HOP | _REQUEST_ONLY_DROPPED)
