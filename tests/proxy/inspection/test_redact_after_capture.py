"""Redaction of what was captured before the rules existed (issue 73, point 3): `mcc redact SRC DST`
on a capture made without rules gives the lines a live capture with the same rules and key writes
(same placeholders, same counts), with no planted secret in any byte of DST; the token files and
ends are redacted, the rest copied; SRC is untouched; `records` reads DST; metrics-only and a
failing hook as live capture; a non-empty or nested DST is refused."""

from __future__ import annotations

import hashlib
import os

import orjson
import pytest
from click.testing import CliRunner

from proxy import main
from records import CaptureStore, end_rollout, read_model_call_records, trajectories
from tests.proxy.privacy.test_redaction import RULES, SECRETS, assert_no_secret, every_byte, planted_calls

KEY = "cd" * 32
#: What two runs of the same calls differ in: the sidecar's ids and clocks.
_VOLATILE = {"model_call_id", "started_at", "completed_at", "latency_ms", "latency_ttft_ms", "token_entries",
             "retry_of"}


@pytest.fixture
def rules_file(tmp_path):
    path = tmp_path / "redact.yaml"
    path.write_text(RULES)
    return str(path)


def _comparable(lines: list[dict]) -> list[dict]:
    return [orjson.loads(orjson.dumps({key: value for key, value in line.items() if key not in _VOLATILE})
                         .replace(b'"id":"chatcmpl', b'"id":"x').replace(b'"id":"resp', b'"id":"x'))
            for line in lines]


def _digest(directory: str) -> str:
    return hashlib.sha256(every_byte(directory)).hexdigest()


async def test_a_redacted_copy_is_what_live_capture_with_the_rules_writes(http, stand_in, start, tmp_path, rules_file,
                                                                         monkeypatch):
    monkeypatch.setenv("MCC_REDACT_KEY", KEY)
    plain_dir, live_dir, copy_dir = (str(tmp_path / name) for name in ("plain", "live", "copy"))
    plain = await start(stand_in.url, capture_dir=plain_dir, capture_tokens=True, capture_raw_stream="always")
    live = await start(stand_in.url, capture_dir=live_dir, capture_tokens=True, capture_raw_stream="always",
                       redact=rules_file, redact_key=KEY)
    for sidecar in (plain, live):
        await planted_calls(http, stand_in, sidecar, "r", token_mode=True)
        await sidecar.close()
    end_rollout(plain_dir, "r", outcome={"reward": 1.0, "note": f"graded {SECRETS[0]}"})
    before = _digest(plain_dir)
    done = CliRunner().invoke(main, ["redact", plain_dir, copy_dir, "--redact", rules_file])
    assert done.exit_code == 0, done.output
    assert "values replaced: acme_id" in done.output and "0 written metrics-only" in done.output
    assert _digest(plain_dir) == before, "the source is only read"
    assert_no_secret(every_byte(copy_dir), "the redacted copy")
    copied, lived = CaptureStore(copy_dir).read("r"), CaptureStore(live_dir).read("r")
    assert _comparable(copied) == _comparable(lived), "the same placeholders and counts as live capture"
    assert len(read_model_call_records(copy_dir, "r")) == len(copied)
    assert os.path.exists(os.path.join(copy_dir, "r.tokens.intents")), "what holds no text is copied"
    build, source_build = trajectories(copy_dir, "r"), trajectories(plain_dir, "r")
    assert (build.masked, [chain.token_ids for chain in build.chains]) == \
        (source_build.masked, [chain.token_ids for chain in source_build.chains]), "the training arrays are kept"


async def test_metrics_only_and_a_failing_hook_as_live_capture(http, stand_in, start, tmp_path):
    plain_dir = str(tmp_path / "plain")
    plain = await start(stand_in.url, capture_dir=plain_dir, capture_tokens=True)
    await planted_calls(http, stand_in, plain, "r", token_mode=True)
    await plain.close()
    bare = str(tmp_path / "bare")
    assert CliRunner().invoke(main, ["redact", plain_dir, bare, "--privacy", "metrics-only"]).exit_code == 0
    assert_no_secret(every_byte(bare), "the metrics-only copy")
    assert not [name for name in os.listdir(bare) if name.endswith(".tokens.jsonl")], "no token file under metrics-only"
    assert all(line["privacy"] == "metrics-only" for line in CaptureStore(bare).read("r"))
    hooked = str(tmp_path / "hooked")
    done = CliRunner().invoke(main, ["redact", plain_dir, hooked, "--redact-hook",
                                     "tests.proxy.privacy.test_redaction:raising_hook"])
    assert done.exit_code == 0 and "written metrics-only (the hook failed)" in done.output, done.output
    assert all(line["redaction_failed"] for line in CaptureStore(hooked).read("r"))
    assert_no_secret(every_byte(hooked), "the copy whose hook failed")


@pytest.mark.parametrize("where", ["inside", "not empty"])
def test_the_copy_goes_to_a_new_directory_outside_the_source(tmp_path, rules_file, where):
    from tests.capture_dirs import chat_line
    source = tmp_path / "src"
    source.mkdir()
    (source / "r.capture.jsonl").write_bytes(chat_line(0))
    target = source / "copy" if where == "inside" else tmp_path / "full"
    if where == "not empty":
        target.mkdir()
        (target / "x").write_text("x")
    done = CliRunner().invoke(main, ["redact", str(source), str(target), "--redact", rules_file])
    assert done.exit_code == 2 and ("never written to" in done.output or "is not empty" in done.output), done.output


def test_a_store_is_redacted_from_its_lines(tmp_path, monkeypatch, rules_file):
    from capture.journal import Uploader
    from tests.capture_dirs import chat_line
    from tests.proxy.privacy.test_redaction import EMAIL

    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    line = orjson.loads(chat_line(0))
    line["request"]["messages"] = [{"role": "user", "content": f"mail {EMAIL}"}]
    spool = tmp_path / "spool" / "segments" / "host.1.aaaa"
    spool.mkdir(parents=True)
    (spool / "0000000001.sealed").write_bytes(b"r1\t" + orjson.dumps(line) + b"\n")
    url = f"segments://{tmp_path / 'store'}"
    Uploader(str(tmp_path / "spool"), url).upload_all()
    copy = str(tmp_path / "copy")
    done = CliRunner().invoke(main, ["redact", url, copy, "--redact", rules_file])
    assert done.exit_code == 0, done.output
    (redacted,) = CaptureStore(copy).read("r1")
    assert "[REDACTED:email:" in redacted["request"]["messages"][0]["content"]
    assert EMAIL.encode() not in every_byte(copy)
