"""Receipts instead of bodies (issue 73, point 4): `mcc export --format receipts` holds, per call,
ids, timings, status, token counts, tool names, sizes and keyed digests, and no text: every planted
secret and every word of the conversation is absent, in JSON lines and in Parquet; the digests are
what the key holder recomputes from the bodies; no key, no receipts."""

from __future__ import annotations

import hashlib
import hmac

import orjson
import pytest
from click.testing import CliRunner

from proxy import main
from records import CaptureStore
from tests.proxy.privacy.test_redaction import SECRETS, planted_calls

KEY = "ab" * 32


async def test_receipts_hold_no_text_and_digests_the_key_holder_can_check(http, stand_in, start, capture_dir, tmp_path,
                                                                         monkeypatch):
    sidecar = await start(stand_in.url, capture_dir=capture_dir)
    await planted_calls(http, stand_in, sidecar, "r")
    await sidecar.close()
    monkeypatch.setenv("MCC_RECEIPT_KEY", KEY)
    jsonl, parquet = str(tmp_path / "receipts.jsonl"), str(tmp_path / "receipts.parquet")
    for output in (jsonl, parquet):
        done = CliRunner().invoke(main, ["export", capture_dir, "--format", "receipts", "-o", output])
        assert done.exit_code == 0, done.output
    data = open(jsonl, "rb").read() + open(parquet, "rb").read()
    for secret in SECRETS:
        assert secret.encode() not in data
    lines = CaptureStore(capture_dir).read("r")
    words = {word for line in lines for message in (line["request"].get("messages") or ())
             if isinstance(message.get("content"), str) for word in message["content"].split() if len(word) > 3}
    assert words and not [word for word in words if word.encode() in data], "no word of the conversation"
    receipts = [orjson.loads(row) for row in open(jsonl, "rb").read().splitlines()]
    assert [receipt["model_call_id"] for receipt in receipts] == [line["model_call_id"] for line in lines]
    first, line = receipts[0], lines[0]
    expected = hmac.new(bytes.fromhex(KEY), orjson.dumps(line["request"], option=orjson.OPT_SORT_KEYS),
                        hashlib.sha256).hexdigest()
    assert first["request_digest"] == expected and first["request_bytes"] > 0 and first["tokens_out"] > 0
    assert any(receipt["tool_names"] for receipt in receipts), "tool names are kept"
    pq = pytest.importorskip("pyarrow.parquet", reason="the Parquet form needs the export extra (pyarrow)")
    table = pq.read_table(parquet).to_pydict()
    assert table["request_digest"] == [receipt["request_digest"] for receipt in receipts]


def test_receipts_need_a_key(tmp_path, monkeypatch):
    monkeypatch.delenv("MCC_RECEIPT_KEY", raising=False)
    from tests.capture_dirs import chat_line
    (tmp_path / "r.capture.jsonl").write_bytes(chat_line(0))
    done = CliRunner().invoke(main, ["export", str(tmp_path), "--format", "receipts", "-o", str(tmp_path / "x.jsonl")])
    assert done.exit_code == 2 and "set MCC_RECEIPT_KEY" in done.output, done.output
    (tmp_path / "short.key").write_text("abcd")
    done = CliRunner().invoke(main, ["export", str(tmp_path), "--format", "receipts", "-o", str(tmp_path / "x.jsonl"),
                                     "--receipt-key-file", str(tmp_path / "short.key")])
    assert done.exit_code == 2 and "32 bytes or more" in done.output, done.output
