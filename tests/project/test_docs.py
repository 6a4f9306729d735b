"""The user docs hold what they say: every command block in README.md and docs/ runs as written,
against the stand-in model; docs/configuration.md is what the settings generate; no page cites a
file a user does not have; every link between the pages lands on a file and a heading.

How a page runs (`run_page`): its ```console / ```sh / ```python blocks in order, in a fresh
directory, each a process of its own that must exit 0. A block after ``<!-- run: background -->``
is a server: started, waited for on its port, stopped when the next server starts or the page
ends. A block after ``<!-- run: skip (why) -->`` is not run (a GPU, a cluster, docker). Before the
page runs, the stand-in model server listens where the docs put vLLM, and the capture directory
the docs name holds a run written through the sidecar in the token capture mode (rollouts
``task17-r0``, two chat turns, and ``gsm8k-17``). The ports and the directory are substituted:
``8000`` (vLLM) and ``8080`` (the sidecar) by free ports, ``/data/...`` by the test's directory;
nothing else of a block changes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import unicodedata
from dataclasses import dataclass

import pytest

from tests.processes import SidecarProcess

from tests import CHECKOUT

ROOT = CHECKOUT
DOCS = os.path.join(ROOT, "docs")
PAGES = ["README.md"] + sorted(f"docs/{name}" for name in os.listdir(DOCS) if name.endswith(".md"))
USER_PAGES = PAGES + ["deploy/README.md", "deploy/gym/README.md"]
SHELL = ("console", "sh", "bash", "shell")
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_MARK = re.compile(r"<!--\s*run:\s*(background|skip)\b([^\n]*?)-->\s*\Z")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    code: str
    mark: str | None  # None, "background" or "skip"


def blocks_of(page: str) -> list[Block]:
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    found = []
    for match in _FENCE.finditer(text):
        before = text[:match.start()].rstrip()
        mark = _MARK.search(before[-300:])
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, match.group(1).lower(), match.group(2),
                           mark.group(1) if mark else None))
    return found


def _runnable(page: str) -> list[Block]:
    return [block for block in blocks_of(page) if block.language in SHELL + ("python",) and block.mark != "skip"]


def test_every_skipped_block_says_why():
    for page in USER_PAGES:
        text = open(os.path.join(ROOT, page), encoding="utf-8").read()
        for mark in re.finditer(r"<!--\s*run:\s*skip\b(.*?)-->", text, re.S):
            assert re.search(r"\(\s*\S.*\)", mark.group(1)), f"{page}: a skipped block without its reason: {mark.group(0)}"


def configuration_reference() -> str:
    """What `make docs` writes to docs/configuration.md."""
    return subprocess.run([sys.executable, "-m", "proxy._configuration_reference"], capture_output=True, text=True,
                          check=True, cwd=ROOT).stdout


def test_the_configuration_reference_is_generated_from_the_settings():
    with open(os.path.join(DOCS, "configuration.md"), encoding="utf-8") as handle:
        on_disk = handle.read()
    assert on_disk == configuration_reference(), "docs/configuration.md is out of date: run `make docs`"


def test_the_records_page_is_generated_from_the_models_and_names_every_field():
    """docs/records.md: every field of what a reader gets, with a meaning, generated from the models
    (``python -m records._reference``)."""
    with open(os.path.join(DOCS, "records.md"), encoding="utf-8") as handle:
        on_disk = handle.read()
    generated = subprocess.run([sys.executable, "-m", "records._reference"], capture_output=True, text=True,
                               check=True, cwd=ROOT).stdout
    assert on_disk == generated, "docs/records.md is out of date: run `make docs`"
    rows = [line for line in on_disk.splitlines() if line.startswith("| `")]
    assert len(rows) > 80 and not [row for row in rows if row.endswith("|  |")], "a field without its meaning"
    for name in ("ModelCallRecord", "TokenRecord", "TrajectoryBuild", "RolloutEnd", "FinishedRollout", "FinishedGroup"):
        assert f"## `{name}`" in on_disk


def test_the_configuration_reference_names_every_setting_a_user_sets():
    from proxy import Settings

    text = configuration_reference()
    internal = {"reuse_port", "metrics_dir", "worker_index", "worker_count"}
    for name in set(Settings.model_fields) - internal:
        assert f"`MCC_{name.upper()}`" in text, name


@pytest.mark.parametrize("page", USER_PAGES)
def test_user_pages_cite_nothing_a_user_does_not_have(page):
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    for pattern in (r"DESIGN", r"\bthe seeds?\b", r"\bissue \d+", r"\.\./shared", r"§"):
        hit = re.search(pattern, text)
        assert hit is None, f"{page}: {text[max(0, hit.start() - 60):hit.end() + 40]!r}"


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = unicodedata.normalize("NFKC", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", USER_PAGES)
def test_links_between_pages_land_on_a_file_and_a_heading(page):
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    prose = _FENCE.sub("", text)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else os.path.join(ROOT, page)
        assert os.path.exists(file), f"{page}: link to {target!r}: no such file"
        if anchor and file.endswith(".md"):
            headings = re.findall(r"^#+\s+(.*)$", _FENCE.sub("", open(file, encoding="utf-8").read()), re.M)
            assert anchor in {_slug(heading) for heading in headings}, f"{page}: link to {target!r}: no such heading"


def test_the_readme_is_a_page_of_recipes():
    """About 200 lines: what it is, the two commands, the four recipes and the map of docs/."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert len(text.splitlines()) <= 250
    for recipe in ("an eval with the OpenAI SDK", "an RL run with training token ids", "a collector", "NeMo Gym"):
        assert re.search(rf"^## Recipe: .*{re.escape(recipe)}", text, re.M | re.I), recipe
    assert "make demo" in text and "make test" in text


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{what} exited with {process.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{what} did not listen on {port} within {timeout:g} s")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def stand_in_model():
    """The stand-in model server, where the docs put vLLM."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "proxy", "stand-in", "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    _wait_for_port(port, process, "the stand-in")
    yield port
    _stop(process)


@pytest.fixture(scope="module")
def captured_run(stand_in_model, tmp_path_factory):
    """A capture dir of a run: two rollouts written through the sidecar in the token capture mode."""
    from openai import OpenAI

    directory = tmp_path_factory.mktemp("run") / "model-calls"
    sidecar = SidecarProcess.start("--upstream", f"http://127.0.0.1:{stand_in_model}", "--capture-dir", str(directory),
                                   "--capture-tokens")
    try:
        agent = OpenAI(base_url=f"{sidecar.url}/ng-rollout/task17-r0/v1", api_key="EMPTY", max_retries=0)
        messages = [{"role": "user", "content": "What is 6 x 7?"}]
        first = agent.chat.completions.create(model="policy", messages=messages)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And 7 x 8?"}]
        agent.chat.completions.create(model="policy", messages=messages)
        agent.with_options(base_url=f"{sidecar.url}/ng-rollout/gsm8k-17/v1").chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "What is 2 + 2?"}], stream=True).response.read()
    finally:
        assert sidecar.terminate() == 0
    return directory


def _substituted(code: str, ports: dict[str, int], data: str) -> str:
    for written, port in ports.items():
        code = re.sub(rf"(?<!\d){written}(?!\d)", str(port), code)
    return code.replace("/data/", f"{data}/")


@pytest.mark.slow
@pytest.mark.parametrize("page", [page for page in PAGES if _runnable(page)])
def test_command_blocks_run_as_written(page, stand_in_model, captured_run, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(captured_run, data / "model-calls")
    (data / "exports").mkdir()
    workdir = tmp_path / "work"
    workdir.mkdir()
    ports = {"8000": stand_in_model, "8080": _free_port()}
    environment = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
                   "PWD": str(workdir)}
    servers: list[subprocess.Popen] = []
    try:
        for block in _runnable(page):
            code = _substituted(block.code, ports, str(data))
            where = f"{page}, the block at line {block.line}"
            command = [sys.executable, "-c", code] if block.language == "python" else ["bash", "-euo", "pipefail", "-c", code]
            if block.mark == "background":
                for server in servers:
                    _stop(server)
                servers = [subprocess.Popen(command, cwd=workdir, env=environment, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, start_new_session=True)]
                _wait_for_port(ports["8080"], servers[0], where)
                continue
            done = subprocess.run(command, cwd=workdir, env=environment, capture_output=True, text=True, timeout=180)
            assert done.returncode == 0, f"{where} failed ({done.returncode}):\n{code}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    finally:
        for server in servers:
            _stop(server)
