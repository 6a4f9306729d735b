"""Files made from captures are as private as the captures (issue 73, point 5): `mcc report`,
`mcc export` (each format) and `mcc compact` write 0600 files in 0700 directories under a umask of
002 (a shared workstation's), and 0640 / 0750 with ``--permissions group``; a file that existed
before with wider modes is narrowed."""

from __future__ import annotations

import os
import stat

import pytest
from click.testing import CliRunner

from proxy import main
from tests.capture_dirs import chat_line


@pytest.fixture
def captures(tmp_path) -> str:
    directory = tmp_path / "captures"
    directory.mkdir()
    (directory / "r1.capture.jsonl").write_bytes(chat_line(0) + chat_line(1))
    return str(directory)


@pytest.fixture(autouse=True)
def shared_umask():
    before = os.umask(0o002)
    yield
    os.umask(before)


def _modes(path: str) -> set[int]:
    found = {stat.S_IMODE(os.stat(path).st_mode)}
    for root, directories, files in os.walk(path) if os.path.isdir(path) else ():
        found |= {stat.S_IMODE(os.stat(os.path.join(root, name)).st_mode) for name in directories + files}
    return found


def _run(*args: str) -> None:
    done = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert done.exit_code == 0, done.output


@pytest.mark.parametrize("permissions, file_mode, directory_mode", [("private", 0o600, 0o700), ("group", 0o640, 0o750)])
def test_the_report_and_every_export_are_as_private_as_the_captures(captures, tmp_path, permissions, file_mode,
                                                                    directory_mode):
    report = str(tmp_path / "report.html")
    open(report, "w").close()
    os.chmod(report, 0o666)  # Left by an earlier run under another umask: narrowed too.
    _run("report", captures, "-o", report, "--permissions", permissions)
    assert _modes(report) == {file_mode}
    assert _modes(report[:-len(".html")] + "_files") == {file_mode, directory_mode}
    for kind, name in (("otel-json", "spans.jsonl"), ("atif", "atif.jsonl"), ("parquet", "calls.parquet")):
        output = str(tmp_path / name)
        _run("export", captures, "--format", kind, "-o", output, "--permissions", permissions)
        assert _modes(output) == {file_mode}, kind


def test_the_environment_says_the_permissions_as_for_the_sidecar(captures, tmp_path, monkeypatch):
    monkeypatch.setenv("MCC_CAPTURE_PERMISSIONS", "group")
    output = str(tmp_path / "spans.jsonl")
    _run("export", captures, "--format", "otel-json", "-o", output)
    assert _modes(output) == {0o640}


def test_a_compaction_of_a_store_is_as_private_as_the_captures(tmp_path, monkeypatch):
    from capture.journal import Uploader

    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    spool = tmp_path / "spool" / "segments" / "host.1.aaaa"
    spool.mkdir(parents=True)
    (spool / "0000000001.sealed").write_bytes(b"r1\t" + chat_line(0))
    Uploader(str(tmp_path / "spool"), f"segments://{tmp_path / 'store'}").upload_all()
    view = tmp_path / "view"
    _run("compact", f"segments://{tmp_path / 'store'}", str(view))
    assert stat.S_IMODE(os.stat(view / "r1.capture.jsonl").st_mode) == 0o600
