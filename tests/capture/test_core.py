"""The compiled per-event core (capture/_core.c) gives what its pure-Python reference gives, bit
for bit (docs/speed.md, "The compiled core").

Each of its functions against the Python it stands in for, on generated inputs made to trip it
(values holding a segment's bytes, quotes, backslashes, empty values, events of another shape);
then whole streams of every dialect, with the token capture mode's cut and without, whole, one
event a read, five a read and at random splits, through a tap on each core: the capture, the
counters and every byte the client gets must be the same. Every other test of the parsers and the
cut runs on both cores too (tests/conftest.py, ``per_event_core``). And the fallback: an install
without the core, or ``MCC_NO_EXTENSIONS=1``, runs the pure Python and says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capture import _native
from capture._event_templates import TEXT, EventTemplate, written_rows
from capture._sse import plain_events
from capture._tap import _TERMINAL_MARKERS, _WHOLE_MARKERS, first_of, split_events

from tests.compiled_core import require_compiled_core
from tests.capture.test_event_templates import (
    REQUEST, _pieces, _tap_through, chat_stream, messages_stream, responses_stream,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def compiled_core() -> None:
    """Every test here compares the compiled core with the Python: it must be there (or no compiler is)."""
    require_compiled_core()


@contextmanager
def on_core(compiled: bool) -> Iterator[None]:
    before = _native.core is not None
    _native.select(compiled)
    try:
        yield
    finally:
        _native.select(before)


def both(function: Any, *args: Any) -> tuple[Any, Any]:
    """``function(*args)`` on the compiled core, then on the Python; exceptions as results."""
    results = []
    for compiled in (True, False):
        with on_core(compiled):
            try:
                results.append(function(*args))
            except Exception as exc:  # noqa: BLE001  # compared, as a result
                results.append((type(exc).__name__,))
    return results[0], results[1]


# -- take_rows: a run of a template's events --------------------------------------------------

#: Segment and value bytes chosen to collide: each other's bytes, quotes, backslashes, commas.
_ATOMS = st.sampled_from([b"a", b'"', b"\\", b",", b':"', b'","', b"}", b"1", b"-0.5", b"\xe2\x82", b""])
_SEGMENT = st.lists(_ATOMS, min_size=1, max_size=3).map(b"".join).filter(bool)


@st.composite
def template_and_parts(draw: st.DrawFn) -> tuple[EventTemplate, list[bytes], int, int]:
    slots = draw(st.integers(1, 4))
    segments = [b"data: {" + draw(_SEGMENT)] + [draw(_SEGMENT) for _ in range(slots - 1)] + [draw(_SEGMENT) + b"}"]
    kinds = tuple(draw(st.sampled_from([TEXT, "number", "ints"])) for _ in range(slots))
    template = EventTemplate(segments, kinds, tuple(range(slots)), lambda columns, count, decoded: None)
    template.maximum = draw(st.sampled_from([1 << 20, 40]))
    parts = []
    for _ in range(draw(st.integers(0, 12))):
        values = [draw(st.lists(_ATOMS, max_size=3).map(b"".join)) for _ in range(slots)]
        part = b"".join(segment + value for segment, value in zip(segments, values)) + segments[-1]
        shape = draw(st.integers(0, 9))
        if shape == 0:
            part = part[:-1]  # Not the last segment.
        elif shape == 1:
            part = b"data: x" + part[7:]  # Not the first.
        parts.append(part)
    return template, parts, draw(st.integers(0, 3)), draw(st.integers(1, 6))


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(template_and_parts())
def test_take_rows_is_take_run(case):
    template, parts, start, shortest = case
    compiled, python = both(template.take_run, parts, start, shortest)
    assert compiled == python


# -- write_rows: a run's events written back --------------------------------------------------

@settings(max_examples=400, deadline=None)
@given(st.integers(0, 4).flatmap(lambda slots: st.tuples(
    st.lists(st.binary(max_size=6), min_size=slots + 1, max_size=slots + 1),
    st.lists(st.lists(st.binary(max_size=5), max_size=6), min_size=slots, max_size=slots),
    st.integers(0, 7))))
def test_write_rows_is_written_rows(case):
    segments, columns, count = case
    compiled, python = both(written_rows, segments, columns, count)
    assert compiled == python


# -- plain_events: a read of plain SSE events -------------------------------------------------

_SSE_BYTES = [b"data: ", b"event: ", b"data:", b"\n", b"\n\n", b"\r", b"\r\n", b": c\n", b"id: 1\n", b'{"a":1}', b"x", b"\xff",
              b"\xe2\x82", b"message_stop", b"[DONE]"]
_SSE_ATOMS = st.sampled_from(_SSE_BYTES)


@settings(max_examples=800, deadline=None)
@given(st.lists(_SSE_ATOMS, max_size=14).map(b"".join), st.sampled_from([1 << 20, 12]))
def test_plain_events_is_the_reference_on_any_bytes(chunk, max_event_bytes):
    compiled, python = both(lambda: (_native.core.plain_events if _native.core else plain_events)(chunk, max_event_bytes))
    assert compiled == python


def test_plain_events_reads_the_shapes_servers_write():
    chunk = b'data: {"a":1}\n\nevent: message_stop\ndata: {}\n\nevent: \ndata: x\n\n'
    expected = ([("message", b'{"a":1}', b'data: {"a":1}'), ("message_stop", b"{}", b"event: message_stop\ndata: {}"),
                 ("message", b"x", b"event: \ndata: x")], 5)
    assert both(lambda: _native.core.plain_events(chunk, 1 << 20) if _native.core else plain_events(chunk, 1 << 20)) \
        == (expected, expected)


# -- first_of and split_events: a read's terminal names and its events -------------------------

_MARKERS = sorted({marker for markers in (*_TERMINAL_MARKERS.values(), *_WHOLE_MARKERS.values()) for marker in markers})


def _on_core(name: str, reference: Any) -> Any:
    return lambda *args: (getattr(_native.core, name) if _native.core else reference)(*args)


@settings(max_examples=800, deadline=None)
@given(st.lists(st.sampled_from([*_SSE_BYTES, *_MARKERS, b'"finish_reason":', b"[DON"]),
                max_size=16).map(b"".join),
       st.lists(st.sampled_from(_MARKERS + [b"\n", b"a"]), max_size=5, unique=True).map(tuple))
def test_first_of_is_the_reference(data, markers):
    compiled, python = both(_on_core("first_of", first_of), data, markers)
    assert compiled == python


@settings(max_examples=800, deadline=None)
@given(st.lists(st.sampled_from([b"\n", b"\n\n", b"\n\n\n", b"data: x", b"{}", b"\r"]), max_size=14).map(b"".join))
def test_split_events_is_the_reference(piece):
    compiled, python = both(_on_core("split_events", split_events), piece)
    assert compiled == python


# -- whole streams through a tap, on each core ------------------------------------------------

def _through(dialect: str, pieces: list[bytes], cut: bool, request: dict) -> tuple[Any, ...]:
    if dialect == "chat":
        tap, out, terminal_at = _tap_through(pieces, True, cut, request)
    else:
        tap, out, terminal_at = _tap_through_dialect(dialect, pieces)
    return (out, terminal_at, tap.has_content, tap._parser.field_lines, tap.generated_so_far(), tap.collected_arrays(),
            tap.templated_events, tap.finish(200))


def _tap_through_dialect(dialect: str, pieces: list[bytes]) -> tuple[Any, bytes, int]:
    from capture import StreamTap

    tap = StreamTap(dialect, learn_after=0)
    terminal_at = -1
    for position, piece in enumerate(pieces):
        if tap.feed(piece) and terminal_at < 0:
            terminal_at = position
    return tap, b"", terminal_at


def _same_on_both(dialect: str, body: bytes, pieces_by_framing: dict[str, list[bytes]], cut: bool, request: dict) -> None:
    for framing, pieces in pieces_by_framing.items():
        compiled, python = both(_through, dialect, pieces, cut, request)
        assert compiled == python, framing


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_stream(), st.booleans(), st.sampled_from([{}, {"logprobs": True}, {"return_token_ids": True}]))
def test_a_chat_stream_is_captured_and_cut_the_same_on_both_cores(events, cut, asked):
    body = b"".join(b"data: " + event + b"\n\n" for event in events)
    _same_on_both("chat", body, _pieces(body, events, seed=len(body)), cut, {**REQUEST, **asked})


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(messages_stream().map(lambda body: ("messages", body)), responses_stream().map(lambda body: ("responses", body))),
       st.randoms(use_true_random=False))
def test_messages_and_responses_streams_are_captured_the_same_on_both_cores(case, rng):
    dialect, body = case
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, 10)))
    events = [event + b"\n\n" for event in body[:-2].split(b"\n\n")]
    framings = {"whole": [body], "one event a read": events,
                "random": [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)])],
                "CRLF": [body.replace(b"\n", b"\r\n")], "byte by byte": [body[at:at + 1] for at in range(min(len(body), 600))]}
    _same_on_both(dialect, body, framings, False, {})


def test_the_core_takes_the_runs_it_is_there_for():
    """Not a vacuous pass: the clean stream's runs are taken by templates on both cores."""
    import orjson

    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [orjson.dumps({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                "logprobs": None, "finish_reason": None}]})]
    events += [orjson.dumps({**head, "choices": [{"index": 0, "delta": {"content": f" t{i}"}, "logprobs": {"content": [
        {"token": f" t{i}", "logprob": -0.5, "bytes": [32, 116], "top_logprobs": []}]}, "finish_reason": None,
        "token_ids": [i]}]}) for i in range(200)]
    body = b"".join(b"data: " + event + b"\n\n" for event in events) + b"data: [DONE]\n\n"
    compiled, python = both(_through, "chat", [body], True, {**REQUEST, "logprobs": True})
    assert compiled == python
    assert compiled[6] > 150  # templated events


# -- the fallback -----------------------------------------------------------------------------

@pytest.mark.parametrize("variable, expected", [(None, "compiled"), ("1", "pure Python (MCC_NO_EXTENSIONS is set)"),
                                                ("0", "compiled")])
def test_mcc_no_extensions_selects_the_pure_python(variable, expected):
    environment = {key: value for key, value in os.environ.items() if key != "MCC_NO_EXTENSIONS"}
    if variable is not None:
        environment["MCC_NO_EXTENSIONS"] = variable
    said = subprocess.run([sys.executable, "-c", "from capture import _native; print(_native.description(), _native.core is None)"],
                          cwd=ROOT, env=environment, capture_output=True, text=True, check=True).stdout.strip()
    assert said == f"{expected} {expected != 'compiled'}"


def test_an_install_without_the_core_runs_the_pure_python_and_says_why(tmp_path):
    """The core's module cannot be imported (a machine without a compiler: pip skipped it)."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nclass _NoCore:\n    def find_spec(self, name, path=None, target=None):\n"
                       "        if name == 'capture._core':\n            raise ImportError('no compiler here')\n"
                       "sys.meta_path.insert(0, _NoCore())\n")
    environment = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    environment.pop("MCC_NO_EXTENSIONS", None)
    said = subprocess.run([sys.executable, "-c", "from capture import _native, StreamTap\n"
                           "tap = StreamTap('chat')\ntap.feed(b'data: {\"id\":\"x\",\"choices\":[]}\\n\\ndata: [DONE]\\n\\n')\n"
                           "print(_native.description())\nprint(tap.finish(200).error_category)"],
                          cwd=ROOT, env=environment, capture_output=True, text=True, check=True).stdout.splitlines()
    assert said[0].startswith("pure Python (the compiled core is not built: no compiler here")
    assert said[1] == "None"
