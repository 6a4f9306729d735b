"""The harness tier's installs (`make harness-e2e`): Claude Code and Codex CLI from the npm registry,
the OpenAI Agents SDK from the package index, each pinned, into a cached directory; a test skips,
saying why, where node, npm or a package cannot be installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.197"
CODEX = "@openai/codex@0.171.0"
AGENTS_SDK = ("openai-agents==0.24.0", "websockets>=13")
CACHE = Path(os.environ.get("MCC_HARNESS_CACHE", Path.home() / ".cache" / "model-call-capture" / "harnesses-1"))


def _npm_bin(name: str) -> Path:
    node_modules = CACHE / "npm" / "node_modules" / ".bin"
    if not (node_modules / name).exists():
        if shutil.which("npm") is None or shutil.which("node") is None:
            pytest.skip("node and npm are not installed: the npm harnesses (Claude Code, Codex CLI) cannot run")
        done = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(CACHE / "npm"),
                               CLAUDE_CODE, CODEX], capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not (node_modules / name).exists():
            pytest.skip(f"npm could not install {CLAUDE_CODE} and {CODEX}: {done.stderr.strip()[-400:]}")
    return node_modules / name


@pytest.fixture(scope="session")
def claude_bin() -> Path:
    return _npm_bin("claude")


@pytest.fixture(scope="session")
def codex_bin() -> Path:
    return _npm_bin("codex")


@pytest.fixture(scope="session")
def agents_python() -> Path:
    python = CACHE / "agents-venv" / "bin" / "python"
    if not (CACHE / "agents-venv" / ".installed").exists():
        done = subprocess.run([sys.executable, "-m", "venv", str(CACHE / "agents-venv")], capture_output=True, text=True)
        if done.returncode == 0:
            done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *AGENTS_SDK], capture_output=True,
                                  text=True, timeout=600)
        if done.returncode != 0:
            pytest.skip(f"pip could not install {' '.join(AGENTS_SDK)}: {done.stderr.strip()[-400:]}")
        (CACHE / "agents-venv" / ".installed").touch()
    return python
