"""`mcc ls` counts a rollout's tokens as `mcc show` does (issue 71, point 7): a stream that reported
no usage is counted from the token capture mode's arrays, not shown as -."""

from __future__ import annotations

import orjson
from click.testing import CliRunner

from proxy import main
from records import read_model_call_records
from tests.wire import fetch, rollout_url


async def test_a_streamed_rollout_without_usage_has_the_tokens_mcc_show_counts(http, stand_in, start, capture_dir):
    sidecar = await start(stand_in.url, capture_dir=capture_dir, capture_tokens=True)
    request = {"model": "policy", "messages": [{"role": "user", "content": "What is 6 x 7?"}], "stream": True}
    for _ in range(2):
        assert (await fetch(http, "POST", rollout_url(sidecar.url, "streamed", "/v1/chat/completions"),
                            orjson.dumps(request))).status == 200
    records = read_model_call_records(capture_dir, "streamed")
    assert all(record.token_counts == "counted" for record in records), "no usage: counted from the arrays"
    (row,) = map(orjson.loads, CliRunner().invoke(main, ["ls", capture_dir, "--json"]).output.splitlines())
    assert row["tokens_in"] == sum(record.tokens_in for record in records) > 0
    assert row["tokens_out"] == sum(record.tokens_out for record in records) > 0
