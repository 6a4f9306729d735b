"""Shared fixtures: real servers on loopback (the sidecar, scripted and stand-in upstreams)."""

from __future__ import annotations

import os
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import aiohttp
import pytest

from proxy import RunningServer, Settings, start_sidecar, start_stand_in
from records import CaptureStore, ModelCallRecord, build_model_call_record

from .compiled_core import require_compiled_core
from .scripted_upstream import ScriptedUpstream
from .wire import RUNNER_TOKEN

SHARED_DIR = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "shared"))

StartSidecar = Callable[..., Awaitable[RunningServer]]


#: The fixtures that build or start a cached tier.
_CACHED_TIERS = frozenset({"gym", "local_ray", "s3_server"})


@pytest.hookimpl(tryfirst=True)  # Before ``-m 'not slow'`` deselects by the marks.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that build or start a cached tier -- NeMo Gym's own code (its cached venv, built in
    about 90 s the first time), a local Ray, an S3 server -- are slow, whatever they measure once it
    is up: `make test-quick` leaves them out (issue 75).
    Then the tests marked slow first, in their order: spread over the workers of ``-n auto`` from
    the start, they do not leave one worker running the longest of them alone at the end."""
    for item in items:
        if _CACHED_TIERS & set(getattr(item, "fixturenames", ())) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


#: The tests of what the compiled per-event core stands in for (capture/_native.py): each runs twice,
#: on the compiled core and on the pure-Python reference, whole, byte by byte and at random splits
#: as it is written. The sidecars these tests start in this process run the core selected.
_BOTH_CORES = ("tests/capture/test_", "tests/conformance/test_reassembly_vs_sdk.py", "tests/conformance/test_vllm_recordings.py",
               "tests/proxy/training/test_token_mode_hardening.py", "tests/proxy/training/test_sglang_tokens.py",
               "tests/proxy/training/test_token_capture_mode.py", "tests/proxy/call/test_generate_dialect.py")
#: Compares the two cores itself.
_CORE_AGAINST_REFERENCE = "tests/capture/test_core.py"
_TESTS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    where = os.path.relpath(str(metafunc.definition.path), _TESTS_ROOT)
    if "per_event_core" in metafunc.fixturenames and where.startswith(_BOTH_CORES) and where != _CORE_AGAINST_REFERENCE:
        # The pure-Python run of each is left to `make test` (`make test-quick` stays under 2 minutes).
        metafunc.parametrize("per_event_core", ["compiled", pytest.param("python", marks=pytest.mark.slow)], indirect=True)


@pytest.fixture(autouse=True)
def per_event_core(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The per-event core a test of `_BOTH_CORES` runs on (its id: ``compiled`` or ``python``);
    None elsewhere (what `capture._native` chose at import). `make test` builds the core: a test
    on ``compiled`` fails where it did not build."""
    which = getattr(request, "param", None)
    if which is None:
        yield None
        return
    from capture import _native

    if which == "compiled":
        require_compiled_core()
    before = _native.core is not None
    _native.select(which == "compiled")
    try:
        yield which
    finally:
        _native.select(before)


@pytest.fixture
async def upstream() -> AsyncIterator[ScriptedUpstream]:
    server = await ScriptedUpstream().start()
    yield server
    await server.close()


@pytest.fixture
async def stand_in() -> AsyncIterator[RunningServer]:
    server = await start_stand_in()
    yield server
    await server.close()


@pytest.fixture
def capture_dir(tmp_path: Any) -> Iterator[str]:
    """A capture directory; afterwards, every line the sidecar wrote there must be a valid record."""
    path = tmp_path / "captures"
    path.mkdir()
    yield str(path)
    assert_every_line_is_a_record(str(path))


#: Tests that send credentials use this marker; no file any test leaves in a capture dir may hold it.
SECRET_MARKER = "mcc-test-secret"


def assert_every_line_is_a_record(capture_dir: str) -> None:
    if not os.path.isdir(capture_dir):  # The test removed it on purpose.
        return
    for name in os.listdir(capture_dir):
        path = os.path.join(capture_dir, name)
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                assert SECRET_MARKER.encode() not in handle.read(), f"a secret reached the disk in {name}"
    store = CaptureStore(capture_dir)
    for rollout_id in store.rollout_ids():
        if not os.path.isfile(store.path_for(rollout_id)):
            continue
        result = store.read_available(rollout_id)
        assert result.malformed == 0, f"{rollout_id}: the sidecar wrote a malformed line"
        for index, line in zip(result.call_indexes, result.lines):
            record = build_model_call_record(line, index)
            assert ModelCallRecord.model_validate(record.model_dump()) == record


@pytest.fixture
def store(capture_dir: str) -> CaptureStore:
    return CaptureStore(capture_dir)


@pytest.fixture
async def start() -> AsyncIterator[StartSidecar]:
    """Start sidecars with the given settings; all are stopped at the end of the test."""
    running: list[RunningServer] = []

    async def _start(upstream_url: str, **overrides: Any) -> RunningServer:
        # The runner's admin token (`tests.wire.RUNNER`) unless the test says otherwise.
        settings = Settings(**{"upstream": upstream_url, "port": 0, "admin_token": RUNNER_TOKEN, **overrides})
        server = await start_sidecar(settings)
        running.append(server)
        return server

    yield _start
    for server in running:
        await server.close()


@pytest.fixture
async def sidecar(start: StartSidecar, upstream: ScriptedUpstream, capture_dir: str) -> RunningServer:
    """A sidecar with capture on, in front of the scripted upstream."""
    return await start(upstream.url, capture_dir=capture_dir, model_name="test-model")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client that sees the bytes as sent: no decompression, no added headers beyond the minimum."""
    async with aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session
