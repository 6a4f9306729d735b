"""Where a JSON value stands in the bytes of a JSON text, found without re-serialising (docs/tokens.md).

The token capture mode cuts values out of vLLM's replies by their byte spans. `found_spans` finds
them the fast way, by searching for each key followed by its value as orjson writes it (vLLM's
compact JSON); `walked_spans` walks the text's containers on the value's path for anything else
(spaces, other float digits, escapes); `spliced` replaces the spans.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

import orjson

# The json module's C scanners, which typeshed does not declare.
_scan_value = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # (text, index) -> (value, end)
_scan_string = json.decoder.scanstring  # type: ignore[attr-defined]  # (text, index after the quote) -> (text, end)
_SPACE = re.compile(r"[ \t\n\r]*")

#: A cut: the value at a path (keys and list positions) and the JSON that replaces it.
Cut = tuple[tuple[Any, ...], str]
#: A span to replace: [start, end) and the replacement bytes.
Span = tuple[int, int, bytes]


def found_spans(data: bytes, cuts: list[Cut], payload: dict[str, Any]) -> Optional[list[Span]]:
    """The cuts' spans found by searching for each key with its value (the fast way), or None
    to walk instead.

    Each value is looked for as ``"name":`` + the value as orjson writes it, right after a ``{``
    or ``,``: inside a JSON string every quote is escaped, so that is a key, never text; and the
    bytes are vLLM's compact JSON, which orjson writes the same way (a difference in a float's
    digits or an escape only sends the event to the walk). Each such key-and-value must occur
    exactly as many times as there are cuts for it, or the event is walked.
    """
    spans = []
    next_from: dict[bytes, int] = {}
    for path, replacement in cuts:
        key = _KEYS.get(path[-1]) or b'"' + path[-1].encode() + b'":'
        pattern = key + orjson.dumps(_at(payload, path))
        at = data.find(pattern, next_from.get(pattern, 0))
        if at <= 0 or data[at - 1] not in _KEY_BEFORE:
            return None
        end = at + len(pattern)
        next_from[pattern] = end
        spans.append((at + len(key), end, replacement.encode()))
    for pattern, end in next_from.items():
        if data.find(pattern, end) >= 0:
            return None  # One more than there are cuts: which is which is not known.
    return spans


def walked_spans(data: bytes, cuts: list[Cut]) -> Optional[list[Span]]:
    """The cuts' spans in ``data``, found by walking the containers on each path; None when a
    path is not there (the parsed payload has it, so the text must: never guess)."""
    text = data.decode("utf-8", "surrogateescape")  # Round-trips every byte exactly.
    spans = []
    for path, replacement in cuts:
        span = _value_span(text, path)
        if span is None:
            return None
        if text[span[0]:span[1]] != replacement:
            spans.append((span[0], span[1], replacement.encode()))
    if len(text) != len(data):  # Not ASCII: from character to byte positions.
        spans = [(_byte_at(text, start), _byte_at(text, end), replacement) for start, end, replacement in spans]
    return spans


def _byte_at(text: str, index: int) -> int:
    return len(text[:index].encode("utf-8", "surrogateescape"))


#: The keys the mode cuts, as they appear in compact JSON.
_KEYS = {name: b'"' + name.encode() + b'":' for name in (
    "logprobs", "token_ids", "prompt_token_ids", "top_logprobs", "input_messages", "output_messages")}


def spliced(data: Any, spans: list[tuple[int, int, Any]]) -> Any:
    """``data`` (bytes or text) with each span replaced."""
    spans.sort()
    pieces: list[Any] = []
    position = 0
    for start, end, replacement in spans:
        pieces += (data[position:start], replacement)
        position = end
    pieces.append(data[position:])
    return data[:0].join(pieces)


#: What precedes a key in compact JSON (vLLM writes no spaces between members): ``{`` and ``,``.
_KEY_BEFORE = frozenset(b"{,")


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


def _value_span(text: str, path: tuple[Any, ...]) -> Optional[tuple[int, int]]:
    """The [start, end) of the JSON value at ``path`` (keys and list positions) in ``text``.

    Walks only the containers on the path; every value beside it is skipped by the C scanner,
    so the cost is a parse of what precedes the value at each level, never a Python loop over
    characters.
    """
    try:
        index = _SPACE.match(text, 0).end()  # type: ignore[union-attr]  # the pattern matches the empty string: never None
        for step in path:
            if type(step) is str:
                index = _member(text, index, step)
            else:
                index = _element(text, index, step)
            if index is None:
                return None
        _, end = _scan_value(text, index)
        return index, end
    except (StopIteration, ValueError, IndexError):
        return None


def _member(text: str, index: int, name: str) -> Optional[int]:
    """Where the value of member ``name`` of the object at ``index`` starts."""
    if text[index] != "{":
        return None
    index = _SPACE.match(text, index + 1).end()  # type: ignore[union-attr]  # the pattern matches the empty string: never None
    while text[index] == '"':
        key, index = _scan_string(text, index + 1)
        index = _SPACE.match(text, index).end()  # type: ignore[union-attr]  # the pattern matches the empty string: never None
        if text[index] != ":":
            return None
        index = _SPACE.match(text, index + 1).end()  # type: ignore[union-attr]  # the pattern matches the empty string: never None
        if key == name:
            return index
        _, index = _scan_value(text, index)
        index = _SPACE.match(text, index).end()  # type: ignore[union-attr]  # the pattern matches the empty string: never None
        if text[index] != ",":
            return None
        index = _SPACE.match(text, index + 1).end()  # type: ignore[union-attr]  # the pattern matches the empty string: never None
    return None


def _element(text: str, index: int, position: int) -> Optional[int]:
    """Where element ``position`` of the list at ``index`` starts."""
    if text[index] != "[":
        return None
    index = _SPACE.match(text, index + 1).end()  # type: ignore[union-attr]  # the pattern matches the empty string: never None
    for _ in range(position):
        _, index = _scan_value(text, index)
        index = _SPACE.match(text, index).end()  # type: ignore[union-attr]  # the pattern matches the empty string: never None
        if text[index] != ",":
            return None
        index = _SPACE.match(text, index + 1).end()  # type: ignore[union-attr]  # the pattern matches the empty string: never None
    return index if text[index] != "]" else None
