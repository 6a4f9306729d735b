"""Event templates: the tap's fast path for a stream's repeated event (issue 34).

A streamed reply is one event over and over: a token's chunk, whose bytes differ from the last
one's only in a few values (the token's text, its logprob, its id). Parsing each into a dict and
folding it key by key costs microseconds of Python an event; a GPU server streams tens of
thousands of them a second.

So once the general path has parsed and folded such an event, the reassembler names its variable
values (the slots: a text, a number, a list of ints) and the event's bytes are learnt as the
constant segments between them. A later event that is exactly those segments around well-formed
values of the slots' kinds is, as JSON, the same object with other values in the slots: its fold
(and its cut, in the token capture mode) is known without parsing it. A run of such events costs a
few byte searches an event; its values are checked, folded and cut once per run.

Why this is the same outcome as the general path, whatever the bytes:

- the segments are the template event's own bytes (learnt by serialising it with a marker in
  each slot, then checked against the event as it came: an upstream that writes other JSON than
  orjson's compact form gets no template);
- the values are split out of a run by its inner segments, and the run is taken only when the
  values rebuild it byte for byte and each is well-formed for its kind: a text with no quote and
  no backslash (so no escape, and no way to end the string early), a JSON number written as
  orjson writes it (a logprob entry kept is orjson's JSON, as the general path keeps it),
  integers joined by commas. None of them holds a quote or a bracket, so the event cannot have
  another structure than the template's;
- a run's texts are decoded by the JSON parser the general path uses (control characters and bad
  UTF-8 rejected as there, each piece on its own when the run is not ASCII: two halves of a
  character must not pass as one), its numbers by the same parser. The first value that fails
  ends the run there; that event takes the general path, which says what is wrong with it.

`tests/capture/test_event_templates.py` compares a tap with templates and one without on spoilt streams.
"""

from __future__ import annotations

import secrets
from itertools import chain, count, repeat
from typing import Any, Callable, Optional

import orjson

from . import _native

#: Slot kinds: the body of a JSON string with no escape; a JSON number; a list of integers (the
#: slot is what stands between its brackets).
TEXT, NUMBER, INTS = "text", "number", "ints"

#: The bytes a list of numbers (or of integers) joined by commas may hold: with nothing else, the
#: JSON parser can read nothing but numbers from it. Whether each is written as orjson writes it
#: (no ``-0``, no ``1E5``; an integer too long for 64 bits is read as a float, and written so)
#: is proved by writing what was read and comparing (issue 34: two C calls, not a regular
#: expression over every byte).
_NUMBER_BYTES, _INT_BYTES = b"0123456789,-+.eE", b"0123456789,-"

#: Stands for each constant segment while a run's values are split out: no event's text holds it
#: (a raw control character is not JSON), and a run that did is rebuilt wrong and not taken so.
_SEPARATOR = b"\x00"
#: A run is taken when it has at least this many events per slot (`EventTemplate.shortest_run`).
_SHORTEST_RUN_PER_SLOT = 4
#: Templates are learnt once a stream has passed this many field lines (about as many events): a
#: template pays on a long stream (an RL rollout's thousands of tokens), while learning one costs
#: more than it saves on a short reply, which the general way folds in one loop (issue 43).
LEARN_AFTER_LINES = 64
#: ... or at once from a read of this many bytes: such a read holds dozens of events (a vLLM token
#: chunk is 150-400 bytes), enough for a template to pay within the read itself. A stream written
#: whole (a fast server, a replay, a proxy that buffers) arrives in a few such reads: waiting for
#: 64 lines would fold all of it the general way (issue 55: 0.57x on the logprob stream).
LEARN_FROM_READ_BYTES = 16 * 1024
#: Events split out at once: bytes.replace searches a haystack under 30,000 bytes the fast way.
_SPLIT_EVENTS = 64

#: Markers put in a template event's slots: unique in this process, random across processes (an
#: event that holds one already is found out: each marker must occur once in the marked event).
_NONCE, _NUMBERS_USED = secrets.token_hex(4), count()

#: A slot: its name (the fold's), where the value is in the payload (keys and list positions), its kind.
Slot = tuple[Any, tuple[Any, ...], str]


class EventTemplate:
    """One learnt event shape: ``segments`` (k + 1 byte strings, the first with the event's SSE
    line prefix) around k slots of ``kinds``. `take_run` collects a run of events of this shape
    (`take`: event by event, when the C way fails); `checked` says how many of them hold
    well-formed values and decodes them; ``fold`` (the reassembler's) folds them; with the token
    capture mode, `write` gives the client's bytes (``output``, `learn_output`)."""

    __slots__ = ("segments", "kinds", "names", "fold", "output", "field_lines", "maximum", "_minimum", "_inner",
                 "_between", "_text_slots")

    def __init__(self, segments: list[bytes], kinds: tuple[str, ...], names: tuple[Any, ...],
                 fold: Callable[[list[list[bytes]], int, list[Any]], None]) -> None:
        self.segments = segments
        self.kinds = kinds
        #: Each column's slot name, in the order of the slots in the event's bytes.
        self.names = names
        #: ``fold(columns, count, decoded)``: the first ``count`` values of each slot's column, and
        #: their values decoded (`checked`).
        self.fold = fold
        #: The client's bytes of one event as segments around the slots that survive the cut:
        #: (segments, slot positions, cut values an event, dropped); None without the mode.
        self.output: Optional[tuple[list[bytes], tuple[int, ...], int, bool]] = None
        #: SSE field lines an event of this shape has (``data:``, and ``event:`` when named).
        self.field_lines = segments[0].count(b"\n") + 1
        #: Longer events take the general path (which drops one past the parser's bound).
        self.maximum = 1 << 20
        self._minimum = sum(map(len, segments))
        #: The segments with the event's blank line after the last; the bytes between two events.
        #: The segments between the slots, each event's middle ended by the separator (`_split_run`).
        self._inner = [b"", *segments[1:-1], _SEPARATOR]
        #: What the compiled core's `take_rows` is given: the segments between the slots, and a
        #: byte a slot, 1 for a text (capture/_core.c).
        self._between = tuple(segments[1:-1])
        self._text_slots = bytes(kind == TEXT for kind in kinds)

    @property
    def shortest(self) -> int:
        """The bytes of the shortest event of this shape, its blank line included."""
        return self._minimum + 2

    @property
    def shortest_run(self) -> int:
        """The fewest events a run must have to be taken: a run's fixed cost grows with its slots
        (some C calls each: split, check, fold, write), about what 3 events cost the general way
        per slot (`benchmarks/bench_cutter.py`: vLLM's logprob chunk, 5 slots, breaks even near 14
        events a read). A shorter run takes the general way."""
        return _SHORTEST_RUN_PER_SLOT * len(self.kinds)

    def may_fit(self, part: bytes) -> bool:
        """``part`` begins and ends as this shape's events do (it is one, or a spoilt one)."""
        return part.startswith(self.segments[0]) and part.endswith(self.segments[-1])

    def take_run(self, parts: list[bytes], start: int, shortest: int = 1) -> tuple[int, list[list[bytes]]]:
        """The run of events of this shape at ``parts[start]`` (each an event without its blank
        line): how many, and each slot's values (a column). Past the first and last segments (each
        event's checked), the work is done in C over the run's middles at once: each inner segment
        replaced by a separator, the values split out, and the middles rebuilt from them and
        compared -- whatever the split did, the run is taken only when it is exactly these segments
        around these values (and `checked` finds the values well-formed). Otherwise event by event
        (`take`). A run shorter than ``shortest`` is counted, not taken (no columns).

        With the compiled core (`capture._native`), all of it is one C call, `take_rows`: the events
        matched in order, each inner segment found after the last, as `take` does."""
        first, last, minimum, maximum = self.segments[0], self.segments[-1], self._minimum, self.maximum
        core = _native.core
        if core is not None:
            fit, taken, found = core.take_rows(parts, start, shortest, first, self._between, last, self._text_slots,
                                               minimum, maximum)
            return (fit, []) if fit < shortest else (taken, found)
        stop = start
        for part in parts[start:] if start else parts:
            if not (part.startswith(first) and part.endswith(last) and minimum <= len(part) <= maximum):
                break
            stop += 1
        count = stop - start
        if count < shortest:
            return count, []
        last_part = parts[stop - 1]
        if count > 1 and not all(segment in last_part for segment in self.segments[1:-1]):
            count -= 1  # The stream's last token chunk (its finish reason set) often ends like the others.
        columns = self._split_run(parts, start, count)
        if columns is not None:
            return count, columns
        columns = [[] for _ in self.kinds]
        return self.take(parts, start, columns) - start, columns

    def _split_run(self, parts: list[bytes], start: int, count: int) -> Optional[list[list[bytes]]]:
        """`take_run`'s C way for ``parts[start:start + count]``, each known to begin and end with
        the first and last segments; None when they are not all this shape."""
        head, tail = len(self.segments[0]), -len(self.segments[-1])
        middles = [part[head:tail] for part in parts[start:start + count]]
        slots = len(self.kinds)
        if slots == 1:  # Nothing to split: the value is what the two segments leave.
            columns = [middles]
        else:
            values: list[bytes] = []
            for at in range(0, count, _SPLIT_EVENTS):
                body = _SEPARATOR.join(middles[at:at + _SPLIT_EVENTS])
                for segment in self.segments[1:-1]:
                    body = body.replace(segment, _SEPARATOR)
                values += body.split(_SEPARATOR)
            if len(values) != slots * count:
                return None
            columns = [values[slot::slots] for slot in range(slots)]
            if written_rows(self._inner, columns, count) != _SEPARATOR.join(middles) + _SEPARATOR:
                return None
        for column, kind in zip(columns, self.kinds):
            if kind == TEXT:
                joined = b"".join(column)
                if b'"' in joined or b"\\" in joined:
                    return None
        return columns

    def take(self, parts: list[bytes], start: int, columns: list[list[bytes]]) -> int:
        """Collect the slot values of ``parts[start:]`` while they fit the segments; the end of the run.

        The hot loop of the stream: a few byte searches an event, nothing parsed."""
        segments, minimum, maximum = self.segments, self._minimum, self.maximum
        first, last = segments[0], segments[-1]
        head, tail = len(first), -len(last)
        end = len(parts)
        at = start
        if len(segments) == 2:  # One slot: the common text chunk.
            (column,) = columns
            is_text = self.kinds[0] == TEXT
            while at < end:
                part = parts[at]
                if not minimum <= len(part) <= maximum or not part.startswith(first) or not part.endswith(last):
                    break
                value = part[head:tail]
                if is_text and (b'"' in value or b"\\" in value):
                    break
                column.append(value)
                at += 1
            return at
        middle = segments[1:-1]
        text_slots = [slot for slot, kind in enumerate(self.kinds) if kind == TEXT]
        while at < end:
            part = parts[at]
            if not minimum <= len(part) <= maximum or not part.startswith(first) or not part.endswith(last):
                break
            position, stop = head, len(part) + tail
            row = []
            for segment in middle:
                found = part.find(segment, position, stop)
                if found < 0:
                    return at
                row.append(part[position:found])
                position = found + len(segment)
            row.append(part[position:stop])
            for slot in text_slots:
                value = row[slot]
                if b'"' in value or b"\\" in value:
                    return at
            for column, value in zip(columns, row):
                column.append(value)
            at += 1
        return at

    def checked(self, columns: list[list[bytes]], count: int) -> tuple[int, list[Any]]:
        """How many of the first ``count`` rows hold well-formed values of their kinds, and those
        rows' values decoded per slot: a text slot's joined, a number slot's as a list (None for
        a list of ints: its JSON is what is kept)."""
        while count:
            decoded: list[Any] = []
            value: Any
            for column, kind in zip(columns, self.kinds):
                if kind == TEXT:
                    good, value = _texts(column, count)
                elif kind == NUMBER:
                    good, value = _numbers(column, count)
                else:
                    good, value = _ints(column, count), None
                if good < count:
                    count = good  # Decoded again over the rows before the first bad one.
                    break
                decoded.append(value)
            else:
                return count, decoded
        return 0, []

    def learn_output(self, cut_marked: bytes, markers: list[bytes], cut_values: int, dropped: bool) -> bool:
        """The token capture mode: the cutter's bytes for this event with a marker in each slot
        (``cut_marked``) give the client's bytes of every event of the run. False when they cannot."""
        split = split_at(cut_marked, markers)
        if split is None or (split[1] and dropped):
            return False
        segments, slots = split
        self.output = (segments, tuple(slots), cut_values, dropped)
        return True

    def write(self, columns: list[list[bytes]], count: int) -> bytes:
        """The client's bytes of ``count`` events of the run (`learn_output`)."""
        segments, slots, _, _ = self.output  # type: ignore[misc]  # output is set once the template is learnt
        return written_rows(segments, [columns[slot] for slot in slots], count)


def written_rows(segments: list[bytes], columns: list[list[bytes]], count: int) -> bytes:
    """``count`` rows, each ``segments`` around one value of each column (len(segments) ==
    len(columns) + 1), joined. Rows joined by a separator: append it to the last segment and
    drop it from the end. With the compiled core, one C call (`write_rows`, the same bytes)."""
    core = _native.core
    if core is not None:
        return core.write_rows(segments, columns, count)
    if not columns:
        return segments[0] * count
    if len(columns) == 1:
        values = columns[0][:count] if count < len(columns[0]) else columns[0]
        return segments[0] + (segments[1] + segments[0]).join(values) + segments[1]
    pieces: list[Any] = [repeat(segments[0], count)]
    for position, column in enumerate(columns):
        pieces += [column[:count], repeat(segments[position + 1], count)]
    return b"".join(chain.from_iterable(zip(*pieces)))


def split_at(marked: bytes, tokens: list[bytes]) -> Optional[tuple[list[bytes], list[int]]]:
    """``marked`` cut at each of ``tokens`` found in it (each at most once): the segments around
    them and which token each gap held, in the order they stand; None when one occurs twice."""
    found = []
    for position, token in enumerate(tokens):
        at = marked.find(token)
        if at >= 0:
            if marked.find(token, at + 1) >= 0:
                return None
            found.append((at, position))
    found.sort()
    segments, start = [], 0
    for at, position in found:
        segments.append(marked[start:at])
        start = at + len(tokens[position])
    segments.append(marked[start:])
    return segments, [position for _, position in found]


def learn_template(prefix: bytes, data: bytes, payload: dict[str, Any], slots: list[Slot],
                   ) -> Optional[tuple[EventTemplate, bytes, dict[str, Any], list[bytes]]]:
    """The template of an event (``prefix``: its lines before the data value, e.g. ``data: ``),
    or None when its bytes are not orjson's compact JSON of ``payload``. Also returned: the event
    with a marker in each slot (its bytes and payload) and each slot's marker as written there,
    in the template's column order (for `learn_output` and the fold's own segments). The caller
    sets ``fold``."""
    nonce = f"{_NONCE}x{next(_NUMBERS_USED)}"
    try:
        marked: Any = orjson.loads(data)  # A copy of ``payload`` of its own, cheaper than copying it.
    except orjson.JSONDecodeError:
        return None
    tokens = []
    for position, (_, path, kind) in enumerate(slots):
        marker = f"mcc{nonce}s{position}"
        container = _at(marked, path[:-1])
        container[path[-1]] = [marker] if kind == INTS else marker
        tokens.append(marker.encode() if kind == TEXT else b'"' + marker.encode() + b'"')
    marked_data = orjson.dumps(marked)
    split = split_at(marked_data, tokens)
    if split is None or len(split[1]) != len(slots):
        return None
    segments, order = split
    segments[0] = prefix + segments[0]
    if any(not segment for segment in segments[1:-1]):
        return None  # Two slots side by side: nothing would tell where one ends.
    template = EventTemplate(segments, tuple(slots[slot][2] for slot in order), tuple(slots[slot][0] for slot in order),
                             _no_fold)
    columns: list[list[bytes]] = [[] for _ in order]
    if template.take([prefix + data], 0, columns) != 1 or template.checked(columns, 1)[0] != 1:
        return None
    for column, slot in zip(columns, order):
        _, path, kind = slots[slot]
        expected = orjson.dumps(_at(payload, path))
        if (expected[1:-1] if kind in (TEXT, INTS) else expected) != column[0]:
            return None
    return template, prefix + marked_data, marked, [tokens[slot] for slot in order]


def _no_fold(columns: list[list[bytes]], count: int, decoded: list[Any]) -> None:
    raise RuntimeError("a template's fold is set by the reassembler that learnt it")


def _at(container: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        container = container[step]
    return container


def _texts(column: list[bytes], count: int) -> tuple[int, Optional[str]]:
    """How many of the first ``count`` text bodies the JSON parser takes, and their text joined."""
    joined = b"".join(column[:count]) if count < len(column) else b"".join(column)
    try:
        text = orjson.loads(b'"' + joined + b'"')
        if joined.isascii():
            return count, text
    except orjson.JSONDecodeError:
        pass
    for position in range(count):  # Each on its own, as the general path parses them.
        try:
            orjson.loads(b'"' + column[position] + b'"')
        except orjson.JSONDecodeError:
            count = position
            break
    joined = b"".join(column[:count])
    return count, joined.decode("utf-8")


def _numbers(column: list[bytes], count: int) -> tuple[int, list[Any]]:
    """How many of the first ``count`` values are one JSON number each, written as orjson writes
    it (the general path keeps a re-serialised entry: a template keeps the bytes), and their values."""
    values = column[:count] if count < len(column) else column
    parsed = _read_back(b",".join(values), _NUMBER_BYTES)
    if parsed is not None and len(parsed) == count:  # One number a value: none holds two, none is empty.
        return count, parsed
    parsed = []
    for value in values:
        number = _read_back(value, _NUMBER_BYTES) if value else None
        if number is None or len(number) != 1:
            break
        parsed += number
    return len(parsed), parsed


def _ints(column: list[bytes], count: int) -> int:
    """How many of the first ``count`` values are integers joined by commas (or nothing: ``[]``),
    each written as orjson writes it."""
    values = column[:count] if count < len(column) else column
    if _read_back(b",".join(filter(None, values)), _INT_BYTES) is not None:
        return count
    for position, value in enumerate(values):
        if value and _read_back(value, _INT_BYTES) is None:
            return position
    return count


def _read_back(joined: bytes, allowed: bytes) -> Optional[list[Any]]:
    """The numbers of ``joined`` (comma-separated, of ``allowed`` bytes only), when that is exactly
    how orjson writes them; else None. (Integers: their bytes hold no ``.`` or ``e``, and one read
    as a float is written back with them.)"""
    if joined.translate(None, allowed):
        return None  # Another byte: a string, a list, a literal, a space -- not one of these.
    written = b"[" + joined + b"]"
    try:
        parsed = orjson.loads(written)
    except orjson.JSONDecodeError:
        return None
    return parsed if orjson.dumps(parsed) == written else None
