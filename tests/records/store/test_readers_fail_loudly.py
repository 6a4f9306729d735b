"""Readers that fail loudly (docs/reading.md, "The mcc commands"): a capture store URL that points
nowhere is an error naming the URL, for the CLI, `python -m records` and the library, unless the
caller allows an empty store; a store whose sidecars have not uploaded yet says so."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
from click.testing import CliRunner

from proxy import main
from records import CaptureStore, NothingUploadedYet, StoreNotFound, read_model_call_records
from records.contract import ObjectStore

from tests import CHECKOUT


def _python_m_records(*args: str, cache: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "records", *args], capture_output=True, text=True,
                          env={"MCC_STORE_CACHE": cache, "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("command", [["ls"], ["stats"], ["stats", "--json"]])
def test_mcc_on_a_store_url_that_points_nowhere_exits_2_naming_the_url(command, tmp_path, monkeypatch):
    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    url = f"segments://{tmp_path / 'no-such-store'}"
    refused = CliRunner().invoke(main, [*command, url], prog_name="mcc")
    assert refused.exit_code == 2
    assert refused.output.startswith(f"mcc: {url}: no capture store there") and "cache" not in refused.output
    allowed = CliRunner().invoke(main, [*command, url, "--allow-empty"], prog_name="mcc")
    assert allowed.exit_code == 0, allowed.output
    if command == ["stats", "--json"]:
        assert orjson.loads(allowed.stdout)["rollouts"] == 0


def test_python_m_records_and_the_library_on_a_store_url_that_points_nowhere(tmp_path):
    url = f"segments://{tmp_path / 'no-such-store'}"
    cache = str(tmp_path / "cache")
    refused = _python_m_records(url, cache=cache)
    assert refused.returncode == 2 and refused.stderr.startswith(f"records: {url}: no capture store there")
    assert refused.stdout == ""
    allowed = _python_m_records("--allow-empty", url, cache=cache)
    assert allowed.returncode == 0 and allowed.stdout == "" and "no capture files in " + url in allowed.stderr
    with pytest.raises(StoreNotFound, match="no capture store there"):
        CaptureStore(url)
    with pytest.raises(FileNotFoundError):  # The package's error is a FileNotFoundError too.
        read_model_call_records(url, "r1")
    assert CaptureStore(url, allow_empty=True).rollout_ids() == []


def test_a_store_whose_sidecars_have_not_uploaded_yet_says_so_with_the_seal_interval(tmp_path, monkeypatch):
    monkeypatch.setenv("MCC_STORE_CACHE", str(tmp_path / "cache"))
    url = f"segments://{tmp_path / 'store'}"
    ObjectStore(url).put("writers/spool-1.json", orjson.dumps({"watermark": 1.0, "holding": [], "seen": []}))
    with pytest.raises(NothingUploadedYet, match="nothing uploaded to .* yet: 1 sidecar.*--segment-max-age"):
        CaptureStore(url)
    said = CliRunner().invoke(main, ["ls", url], prog_name="mcc")
    assert said.exit_code == 2 and f"nothing uploaded to {url} yet" in said.output
    assert CliRunner().invoke(main, ["ls", url, "--allow-empty"], prog_name="mcc").exit_code == 0


async def _call_and_end(url: str) -> None:
    import aiohttp

    from tests.wire import RUNNER

    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/ng-rollout/r1/v1/chat/completions",
                             json={"model": "m", "messages": [{"role": "user", "content": "a secret prompt"}]}) as reply:
            assert reply.status == 200
        async with http.post(f"{url}/-/rollouts/r1/end", json={"outcome": {"reward": 1}}, headers=RUNNER) as reply:
            assert reply.status == 200


def _modes(root) -> dict[str, int]:
    import os
    import stat

    found = {}
    for directory, _, files in os.walk(root):
        found[os.path.relpath(directory, root)] = stat.S_IMODE(os.stat(directory).st_mode)
        for name in files:
            path = os.path.join(directory, name)
            found[os.path.relpath(path, root)] = stat.S_IMODE(os.stat(path).st_mode)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("permissions, file_mode, directory_mode", [(None, 0o600, 0o700), ("group", 0o640, 0o750)])
@pytest.mark.parametrize("layout", ["directory", "store"])
async def test_every_file_and_directory_the_sidecar_creates_is_private_by_default(tmp_path, layout, permissions, file_mode,
                                                                                directory_mode):
    """Lines hold whole prompts and replies: files 0600 and directories 0700 under any umask (the
    capture dir, token files, the end, the spool, segments, the store's objects), or 0640 / 0750
    with ``--capture-permissions group``."""
    import os
    import stat

    from tests.processes import SidecarProcess
    from tests.wire import RUNNER_TOKEN

    where = (["--capture-dir", str(tmp_path / "captures")] if layout == "directory" else
             ["--capture-dir", str(tmp_path / "spool"), "--capture-store", f"segments://{tmp_path / 'store'}",
              "--segment-max-age", "0.2"])
    extra = ["--capture-permissions", permissions] if permissions else []
    saved = os.umask(0o002)  # A permissive umask, as a shell's often is: the sidecar's own wins.
    try:
        sidecar = SidecarProcess.start("--stand-in", "--capture-tokens", *where, *extra,
                                       env={"MCC_ADMIN_TOKEN": RUNNER_TOKEN})
    finally:
        os.umask(saved)
    try:
        await _call_and_end(sidecar.url)
        import asyncio

        await asyncio.sleep(1.0)  # The segment sealed and uploaded, the watermark put.
    finally:
        assert sidecar.terminate() == 0
    modes = _modes(tmp_path)
    assert len(modes) > 6, modes
    for path, mode in modes.items():
        if path == ".":
            continue  # The test's own directory.
        is_directory = stat.S_ISDIR(os.stat(tmp_path / path).st_mode)
        assert mode == (directory_mode if is_directory else file_mode), f"{path}: {oct(mode)}"


async def test_forward_model_api_refuses_other_paths_and_passes_every_path_the_sdks_and_token_mode_use(tmp_path):
    """``--forward model-api``: vLLM's admin and development routes are answered 404 here (with a
    log line naming the setting) and never reach the model; every path the SDKs, the token mode
    and health checks use is forwarded, prefixed or not (a local reply carries x-mcc-local-response)."""
    import aiohttp
    from openai import AsyncOpenAI

    from tests.processes import SidecarProcess

    sidecar = SidecarProcess.start("--stand-in", "--forward", "model-api", "--capture-dir", str(tmp_path / "c"),
                                   "--capture-tokens")
    try:
        async with aiohttp.ClientSession() as http:
            for method, path in [("POST", "/reset_prefix_cache"), ("POST", "/collective_rpc"), ("POST", "/sleep"),
                                 ("POST", "/v1/load_lora_adapter"), ("GET", "/metrics"), ("GET", "/docs"),
                                 ("POST", "/ng-rollout/r1/reset_prefix_cache"), ("GET", "/v1/chat/completions/../x")]:
                async with http.request(method, sidecar.url + path) as reply:
                    assert reply.status == 404 and reply.headers.get("x-mcc-local-response") == "not_forwarded", path
                    assert "--forward model-api" in (await reply.json())["error"]["message"]
            for prefix in ("", "/ng-rollout/r1", "/ng-rollout/r1/training-token-capture"):
                for method, path in [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                                     ("POST", "/v1/responses"), ("GET", "/v1/responses/resp_1"),
                                     ("POST", "/v1/responses/resp_1/cancel"), ("GET", "/v1/responses/resp_1/input_items"),
                                     ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens"),
                                     ("GET", "/v1/models"), ("GET", "/v1/models/m"), ("POST", "/v1/embeddings"),
                                     ("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/inference/v1/generate"),
                                     ("GET", "/health"), ("GET", "/v1/models?limit=5")]:
                    async with http.request(method, sidecar.url + prefix + path, json={"model": "m", "prompt": "x"}) as reply:
                        assert reply.headers.get("x-mcc-local-response") != "not_forwarded", (prefix, path)
        client = AsyncOpenAI(base_url=f"{sidecar.url}/ng-rollout/sdk/v1", api_key="x")
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content
    finally:
        assert sidecar.terminate() == 0
    said = "".join(sidecar.stderr_lines)
    assert "/reset_prefix_cache answered 404, not forwarded: --forward model-api (MCC_FORWARD)" in said


@pytest.mark.slow
async def test_counts_where_usage_is_missing_come_from_the_token_modes_arrays_marked_counted(tmp_path):
    """A streamed chat call without ``include_usage`` reports no usage: in the token mode its
    record counts prompt and generated tokens from the arrays (``token_counts: counted``) and
    `mcc show` says why; without the arrays the counts stay None (never 0) and it says so too. A
    stand-in with ``--force-include-usage`` reports usage on every stream, as vLLM's flag does."""
    import aiohttp

    from proxy.standin import create_stand_in_app, start_app
    from tests.processes import SidecarProcess

    async def stream(url: str, rollout: str) -> None:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/ng-rollout/{rollout}/v1/chat/completions", json={
                    "model": "m", "stream": True, "messages": [{"role": "user", "content": "count me"}]}) as reply:
                assert reply.status == 200 and (await reply.read()).rstrip().endswith(b"[DONE]")

    plain = await start_app(create_stand_in_app(), "127.0.0.1", 0)
    forced = await start_app(create_stand_in_app(force_include_usage=True), "127.0.0.1", 0)
    try:
        for upstream, directory, tokens in ((plain, "tokens", True), (plain, "plain", False), (forced, "forced", False)):
            sidecar = SidecarProcess.start("--upstream", upstream.url, "--capture-dir", str(tmp_path / directory),
                                           *(["--capture-tokens"] if tokens else []))
            try:
                await stream(sidecar.url, "r1")
            finally:
                assert sidecar.terminate() == 0
    finally:
        await plain.close()
        await forced.close()
    (counted,) = read_model_call_records(str(tmp_path / "tokens"), "r1")
    assert counted.token_counts == "counted" and counted.tokens_in > 0 and counted.tokens_out > 0
    assert counted.tokens_total == counted.tokens_in + counted.tokens_out
    (none,) = read_model_call_records(str(tmp_path / "plain"), "r1")
    assert (none.token_counts, none.tokens_in, none.tokens_out) == (None, None, None)
    (reported,) = read_model_call_records(str(tmp_path / "forced"), "r1")
    assert reported.token_counts == "reported" and reported.tokens_out == counted.tokens_out
    shown = CliRunner().invoke(main, ["show", str(tmp_path / "tokens"), "r1"], prog_name="mcc").output
    assert "reported no usage" in shown and f"counted from the token mode's arrays instead: call 0 in {counted.tokens_in}" in shown
    shown = CliRunner().invoke(main, ["show", str(tmp_path / "plain"), "r1"], prog_name="mcc").output
    assert "no token arrays were captured" in shown
    # The Parquet export's rows count them the same way, and say so.
    import pyarrow.parquet as pq

    for directory, counts in (("tokens", "counted"), ("plain", None), ("forced", "reported")):
        output = str(tmp_path / f"{directory}.parquet")
        result = CliRunner().invoke(main, ["export", str(tmp_path / directory), "--format", "parquet", "-o", output],
                                    prog_name="mcc")
        assert result.exit_code == 0, result.output
        (row,) = pq.read_table(output).to_pylist()
        record = read_model_call_records(str(tmp_path / directory), "r1")[0]
        assert (row["token_counts"], row["tokens_in"], row["tokens_out"]) == (counts, record.tokens_in, record.tokens_out)


async def test_every_metric_the_sidecar_serves_is_in_the_operations_page(tmp_path):
    import os

    import aiohttp

    from tests.processes import SidecarProcess

    sidecar = SidecarProcess.start("--stand-in", "--capture-dir", str(tmp_path / "c"), "--capture-tokens")
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(sidecar.url + "/-/metrics") as reply:
                served = {line.split()[2] for line in (await reply.text()).splitlines()
                          if line.startswith("# TYPE mcc_") and not line.split()[2].endswith("_created")}
    finally:
        assert sidecar.terminate() == 0
    with open(os.path.join(CHECKOUT, "docs", "operations.md"), encoding="utf-8") as handle:
        page = handle.read()
    assert len(served) > 25
    assert sorted(name for name in served if name.removesuffix("_total") not in page) == []
