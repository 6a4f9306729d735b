"""`records.ray_dataset` on a local Ray (issue 24): the rows and arrays `records`' own readers give,
read tasks over grouped files, and a directory several sidecars write while the dataset reads it.

Ray runs here as users run it on one machine (``ray.init`` with 2 CPUs, on loopback); an existing
cluster, joined by address, is `tests/records/training/test_ray_cluster.py`.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from records.store import CALL_COLUMNS, call_row
from records import CaptureStore, iter_token_records, ray_dataset
from records.training import capture_files
from records.contract.reading import split_attempt
from records.training._datasets import ROLLOUT_COLUMNS, group_files, read_group, token_row

from tests.capture_dirs import make_capture_dir, make_token_dir

from tests import CHECKOUT

#: Calls each of the 8 agents makes in the several-sidecars test.
TURNS = 30

ray = pytest.importorskip("ray", reason="Ray Data is the optional extra model-call-capture[ray] (make install has it)")


@pytest.fixture(scope="module")
def local_ray():
    # address="local": a Ray of its own, even where `ray start` left a cluster's address in /tmp/ray.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             runtime_env={"env_vars": {"PYTHONPATH": CHECKOUT}})
    from ray.data import DataContext
    context = DataContext.get_current()
    context.enable_progress_bars = False
    yield
    ray.shutdown()


def expected_token_rows(directory: str) -> list[dict]:
    """What `records`' readers say, in the dataset's row form."""
    store, rows = CaptureStore(directory), []
    for rollout_id in store.rollout_ids():
        result = store.read_available(rollout_id)
        base, attempt = split_attempt(rollout_id)
        for record in iter_token_records(store, rollout_id):
            rows.append({**token_row(record), "rollout_base": base, "attempt": attempt,
                         "rollout_incomplete": store.is_incomplete(rollout_id),
                         "rollout_unreadable_lines": result.malformed})
    return rows


def sort_key(row: dict) -> tuple:
    return row["rollout_id"], row["call_index"], row.get("choice_index", 0)


@pytest.mark.slow
def test_token_rows_and_arrays_equal_records_readers(tmp_path, local_ray):
    directory = str(tmp_path / "captures")
    make_token_dir(directory, rollouts=12, calls=4, tokens=50)
    (tmp_path / "captures" / "lost-0.capture.incomplete").write_bytes(b"")  # A rollout with no line at all.
    rows = sorted(ray_dataset(directory, kind="tokens", target_bytes_per_task=20_000).take_all(), key=sort_key)
    expected = sorted(expected_token_rows(directory), key=sort_key)
    assert len(rows) == len(expected) == 12 * 4 + 3 * 4 + 2 * 4  # n=2 in 3 rollouts; 2 retried attempts
    for got, want in zip(rows, expected):
        assert {k: (list(v) if isinstance(v, tuple) else v) for k, v in got.items()} == want
    torn = [r for r in rows if r["rollout_id"] == "rl-00004"]
    assert {(r["rollout_incomplete"], r["rollout_unreadable_lines"]) for r in torn} == {(True, 1)}
    retried = [r for r in rows if r["rollout_id"] == "rl-00004-a1"]
    assert {(r["rollout_base"], r["attempt"], r["rollout_unreadable_lines"]) for r in retried} == {("rl-00004", 1, 0)}
    first = [r for r in rows if r["rollout_id"] == "rl-00000"]
    assert [(r["extends"], r["drift_at"]) for r in first] == [(None, None), (0, None), (None, 50), (2, None)]
    assert all(r["usable"] for r in rows) and not any(r["rollout_id"] == "lost-0" for r in rows)


def test_malformed_id_lists_read_as_records_reads_them(tmp_path):
    """A bool, a float, a string, a null or a nested list among the ids: the dataset's rows carry
    the reader's own verdict (and 0 and 1 stay ids like any other)."""
    import orjson

    from tests.capture_dirs import token_line
    directory = tmp_path / "captures"
    directory.mkdir()
    bad = [[1, True, 3], [1, 2.0, 3], [1, "2", 3], [1, None], [[1], [2]], [True, False], [0, 1, 1]]
    for number, ids in enumerate(bad):
        line = orjson.loads(token_line([5, 6], [7, 8, 9]))
        line["response"]["prompt_token_ids"] = ids
        (directory / f"bad-{number}.capture.jsonl").write_bytes(orjson.dumps(line) + b"\n" + token_line([5, 6, 7, 8, 9, 4], [1]))
    files = [path for path, _ in capture_files(str(directory))]
    rows = sorted((row for table in read_group(files, "tokens") for row in table.to_pylist()), key=sort_key)
    assert rows == sorted(expected_token_rows(str(directory)), key=sort_key)
    verdicts = {row["rollout_id"]: row["problem"] for row in rows if row["call_index"] == 0}
    assert [verdicts[f"bad-{n}"] for n in range(6)] == ["prompt_token_ids is not a list of integers"] * 6
    assert verdicts["bad-6"] is None, "0 and 1 are token ids like any other"


def expected_call_rows(directory: str) -> list[dict]:
    store, rows = CaptureStore(directory), []
    for rollout_id in store.rollout_ids():
        result = store.read_available(rollout_id)
        for index, line in zip(result.call_indexes, result.lines):
            rows.append(call_row(rollout_id, index, line).as_dict())
    return rows


@pytest.mark.slow
def test_every_dialect_reads_as_records_reads_it(tmp_path, local_ray):
    """Chat, Responses, Messages and Completions calls, cut streams and 429s beside token lines:
    both kinds of rows equal what `records`' readers give for the same files."""
    from tests.capture_dirs import make_conversation_dir
    directory = str(tmp_path / "captures")
    make_conversation_dir(directory)
    make_token_dir(directory, rollouts=3, calls=2, tokens=10)
    tokens = sorted(ray_dataset(directory, kind="tokens").take_all(), key=sort_key)
    assert [{k: (list(v) if isinstance(v, tuple) else v) for k, v in row.items()} for row in tokens] == \
        sorted(expected_token_rows(directory), key=sort_key)
    calls = sorted(ray_dataset(directory, kind="calls").take_all(), key=sort_key)
    expected = sorted(expected_call_rows(directory), key=sort_key)
    assert len(calls) == len(expected) == 4 * 3 + 3 * 2
    for got, want in zip(calls, expected):
        for name, _ in CALL_COLUMNS:
            value = got[name]
            if name in ("started_at", "completed_at") and value is not None:
                value = value.timestamp()
            assert value == want[name], (name, got["rollout_id"], got["call_index"])
    assert {row["dialect"] for row in calls} == {"chat", "responses", "messages", "completions"}


def test_call_rows_equal_the_parquet_exports_columns(tmp_path, local_ray):
    directory = str(tmp_path / "captures")
    make_capture_dir(directory, rollouts=7, calls=9)
    with open(os.path.join(directory, "rollout-0003.capture.jsonl"), "ab") as handle:
        handle.write(b"not json\n")
    dataset = ray_dataset([directory], kind="calls", override_num_blocks=3)
    rows = sorted(dataset.take_all(), key=sort_key)
    assert list(rows[0]) == [name for name, _ in CALL_COLUMNS + ROLLOUT_COLUMNS]
    store = CaptureStore(directory)
    expected = sorted((call_row(rid, index, line).as_dict() for rid in store.rollout_ids()
                       for index, line in zip(store.read_available(rid).call_indexes, store.read_available(rid).lines)),
                      key=sort_key)
    assert len(rows) == len(expected) == 63
    for got, want in zip(rows, expected):
        for name, _ in CALL_COLUMNS:
            value = got[name]
            if name in ("started_at", "completed_at"):
                value = value.timestamp() if value is not None else None
            assert value == want[name] or (isinstance(value, list) and value == list(want[name])), (name, got, want)
    assert {r["rollout_unreadable_lines"] for r in rows if r["rollout_id"] == "rollout-0003"} == {1}


def test_small_files_are_grouped_and_a_task_reads_in_bounded_blocks(tmp_path):
    directory = str(tmp_path / "captures")
    make_token_dir(directory, rollouts=40, calls=2, tokens=20)
    files = capture_files(directory)
    assert len(files) == 48, "40 rollouts and 8 retried attempts"
    groups = group_files(files, parallelism=4, target_bytes=64 << 20)
    assert len(groups) == 1, "small files in all: one task, not 48"
    assert [p for g in group_files(files, parallelism=4, target_bytes=30_000) for p, _ in g] == [p for p, _ in files]
    assert all(sum(size for _, size in g) <= 30_000 or len(g) == 1 for g in group_files(files, 4, 30_000))
    # Equal groups, so that no small remainder leaves the other CPUs idle at the end; asked again
    # with their count (as Ray asks), the same groups.
    equal = [(f"f{i}", 590_000) for i in range(360)]
    groups = group_files(equal, parallelism=8, target_bytes=64 << 20)
    assert len(groups) == 8 and {len(g) for g in groups} == {45}
    assert group_files(equal, parallelism=len(groups), target_bytes=64 << 20) == groups
    assert [len(g) for g in group_files([("big", 100), ("a", 1), ("b", 1)], 2, 60)] == [1, 2], "a file is never split"
    import records.training._datasets as datasets
    before = datasets.BLOCK_ROWS
    datasets.BLOCK_ROWS = 7
    try:
        blocks = list(read_group([p for p, _ in files], "tokens"))
    finally:
        datasets.BLOCK_ROWS = before
    # 40 rollouts x 2 calls, a second choice in 10 of them; 8 retried attempts (2 of them with n=2).
    assert max(block.num_rows for block in blocks) <= 7 and sum(b.num_rows for b in blocks) == 80 + 20 + 16 + 4
    with pytest.raises(FileNotFoundError, match="neither a capture directory"):
        capture_files(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="kind must be one of"):
        ray_dataset(directory, kind="rows")


def test_training_rows_filter_and_write_parquet(tmp_path, local_ray):
    """The README's recipe: usable, drift-free generations to Parquet, read back by pyarrow."""
    import pyarrow.parquet as pq
    directory = str(tmp_path / "captures")
    make_token_dir(directory, rollouts=8, calls=3, tokens=30)
    dataset = ray_dataset(directory, kind="tokens")
    training = dataset.filter(lambda row: row["usable"] and row["drift_at"] is None)
    training.write_parquet(str(tmp_path / "training"))
    table = pq.read_table(str(tmp_path / "training"))
    expected = [r for r in expected_token_rows(directory) if r["usable"] and r["drift_at"] is None]
    assert table.num_rows == len(expected) > 0
    assert sorted(table.column("generation_token_ids").to_pylist()) == sorted(r["generation_token_ids"] for r in expected)


@pytest.mark.slow
def test_the_runs_parquet_answers_duckdb_as_the_readers_do(tmp_path, local_ray):
    """What the README exports a run for: DuckDB reads the dataset's Parquet directories and the
    one-process export's file as they are (timestamps in UTC, list columns), and its answers are
    the readers'."""
    duckdb = pytest.importorskip("duckdb", reason="DuckDB is a test dependency (make install has it)")
    from click.testing import CliRunner

    from proxy import main

    directory = str(tmp_path / "captures")
    make_token_dir(directory, rollouts=8, calls=3, tokens=30)
    calls, tokens, one_file = (str(tmp_path / name) for name in ("calls", "tokens", "calls.parquet"))
    ray_dataset(directory, kind="calls").write_parquet(calls)
    ray_dataset(directory, kind="tokens").write_parquet(tokens)
    done = CliRunner().invoke(main, ["export", directory, "--format", "parquet", "-o", one_file])
    assert done.exit_code == 0, done.output
    query = duckdb.connect().sql

    # 8 rollouts of 3 calls, and rollout 4's retried attempt (-a1); every call 1 s long.
    assert query(f"SELECT count(*), count(DISTINCT rollout_base), max(attempt), sum(rollout_incomplete::int) "
                 f"FROM read_parquet('{calls}/*.parquet')").fetchall() == [(27, 8, 1, 3)]
    assert query(f"SELECT dialect, count(*), avg(latency_ms) FROM '{one_file}' GROUP BY 1").fetchall() == [("chat", 27, 1000.0)]
    (kind, first), = query(f"SELECT any_value(typeof(started_at)), min(started_at) FROM read_parquet('{calls}/*.parquet')").fetchall()
    assert kind == "TIMESTAMP WITH TIME ZONE" and first.timestamp() == 1767225600.0

    training = [row for row in expected_token_rows(directory) if row["usable"] and row["drift_at"] is None]
    where = f"FROM read_parquet('{tokens}/*.parquet') WHERE usable AND drift_at IS NULL"
    assert query(f"SELECT count(*), sum(len(prompt_token_ids)), sum(len(generation_log_probs)) {where}").fetchall() == [
        (len(training), sum(len(row["prompt_token_ids"]) for row in training),
         sum(len(row["generation_log_probs"]) for row in training))]
    wanted = next(row for row in training if row["rollout_id"] == "rl-00003" and row["choice_index"] == 1)
    assert query(f"SELECT prompt_token_ids, generation_token_ids {where} AND rollout_id = 'rl-00003' AND "
                 f"call_index = {wanted['call_index']} AND choice_index = 1").fetchall() == [
        (wanted["prompt_token_ids"], wanted["generation_token_ids"])]


def test_mcc_export_on_ray_writes_the_datasets_rows(tmp_path, local_ray):
    """`mcc export --ray`: the directory too big for one process, read by the dataset, as Parquet."""
    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from proxy import main

    directory = str(tmp_path / "captures")
    make_token_dir(directory, rollouts=6, calls=3, tokens=20)
    # 6 rollouts of 3 calls and one retried attempt; a second choice in rollout 3.
    for flags, rows in (([], 6 * 3 + 3), (["--token-arrays"], 6 * 3 + 3 + 3)):
        output = str(tmp_path / f"out{len(flags)}")
        done = CliRunner().invoke(main, ["export", directory, "--format", "parquet", "--ray", "local", "-o", output, *flags])
        assert done.exit_code == 0, done.output
        assert done.output.strip().endswith(f"{rows:,} rows")
        assert pq.read_table(output).num_rows == rows
    refused = CliRunner().invoke(main, ["export", directory, "--format", "otel-json", "--ray", "auto", "-o", str(tmp_path / "x")])
    assert refused.exit_code == 2 and "--ray writes Parquet" in refused.output


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["--token-arrays"]])
def test_one_export_command_gives_one_schema_with_or_without_ray(tmp_path, local_ray, flags):
    """Issue 33, point 4: `mcc export --format parquet` in one process and with `--ray` write the
    same columns (token arrays included: no call column dropped, none renamed), the same rows, and
    files that say what made them."""
    import json

    import pyarrow.parquet as pq
    from click.testing import CliRunner

    from proxy import main

    directory = str(tmp_path / "captures")
    make_token_dir(directory, rollouts=4, calls=3, tokens=10)
    alone, spread = str(tmp_path / "alone.parquet"), str(tmp_path / "spread")
    for extra, output in (([], alone), (["--ray", "local"], spread)):
        done = CliRunner().invoke(main, ["export", directory, "--format", "parquet", "-o", output, *flags, *extra])
        assert done.exit_code == 0, done.output
    one, many = pq.read_table(alone), pq.read_table(spread)
    assert one.schema.names == many.schema.names and "added_request_fields" in one.schema.names
    assert ("token_source" in one.schema.names) == bool(flags) and "rollout_base" in one.schema.names
    key = lambda row: (row["rollout_id"], row["call_index"], row.get("choice_index", 0))  # noqa: E731
    assert sorted(one.to_pylist(), key=key) == sorted(many.to_pylist(), key=key)
    for table in (one, pq.ParquetFile(next(os.path.join(spread, n) for n in os.listdir(spread) if n.endswith(".parquet"))).schema_arrow):
        metadata = (table.schema if hasattr(table, "schema") else table).metadata
        assert metadata[b"model_call_capture.source_directory"] == os.path.abspath(directory).encode()
        assert json.loads(metadata[b"model_call_capture.arguments"])["token_arrays"] is bool(flags)
        assert b"model_call_capture.version" in metadata and b"model_call_capture.exported_at" in metadata


@pytest.mark.slow
async def test_several_sidecars_write_one_directory_while_the_dataset_reads_it(tmp_path, local_ray):
    """Three sidecar processes append to the same rollouts' files in one directory (flock + fsync,
    docs/files.md) while the dataset reads it again and again: every read sees whole lines only, never
    fewer calls than the last, and the last read equals records' readers and every call sent."""
    import aiohttp

    from proxy import start_stand_in

    from tests.processes import SidecarProcess

    stand_in = await start_stand_in(delay=0.1)  # A generation's time, so the writing lasts a few seconds.
    capture_dir = str(tmp_path / "shared")
    sidecars = [await asyncio.to_thread(SidecarProcess.start, "--upstream", stand_in.url, "--capture-dir", capture_dir)
                for _ in range(3)]
    sent = 0
    try:
        async with aiohttp.ClientSession() as http:
            async def agent(number: int) -> int:
                calls = 0
                for turn in range(TURNS):
                    sidecar = sidecars[(number + turn) % 3]
                    url = f"{sidecar.url}/ng-rollout/run-{number % 4}/v1/chat/completions"
                    body = {"model": "m", "messages": [{"role": "user", "content": f"agent {number} turn {turn}"}],
                            "stream": turn % 2 == 0}
                    async with http.post(url, json=body) as reply:
                        assert reply.status == 200
                        await reply.read()
                    calls += 1
                return calls

            agents = asyncio.gather(*(agent(number) for number in range(8)))
            seen = []
            while not agents.done():
                rows = await asyncio.to_thread(lambda: ray_dataset(capture_dir, kind="calls").take_all())
                assert all(row["rollout_unreadable_lines"] == 0 for row in rows), "a reader saw a partial line"
                seen.append(len(rows))
                await asyncio.sleep(0.05)
            sent = sum(await agents)
    finally:
        for sidecar in sidecars:
            assert sidecar.terminate() == 0
        await stand_in.close()
    assert len(seen) >= 2 and seen == sorted(seen), f"read while they wrote, the calls on disk only growing: {seen}"
    rows = ray_dataset(capture_dir, kind="calls").take_all()
    store = CaptureStore(capture_dir)
    assert len(rows) == sent == 8 * TURNS == sum(len(store.read_available(rid).lines) for rid in store.rollout_ids())
    assert sorted(r["model_call_id"] for r in rows) == sorted(
        line["model_call_id"] for rid in store.rollout_ids() for line in store.read_available(rid).lines)
    assert len({r["model_call_id"] for r in rows}) == 8 * TURNS


# A read task places each prompt by its JSON bytes and parses only what a turn adds (see
# records/training/_token_arrays.py); whatever the shape of a rollout, its rows must be the reader's.
_TURN = st.tuples(
    st.sampled_from(["extends", "equals", "extends-older", "drifts", "digit-more", "fresh", "same", "empty"]),
    st.lists(st.integers(0, 300_000), min_size=0, max_size=6),  # what the turn adds / generates
    st.sampled_from(["orjson", "spaces", "per-choice", "request-too", "message", "float", "bool", "negative"]),
    st.integers(1, 2),  # n
)


def _turn_line(prompt: list, generated: list[int], encoding: str, n: int, call: int) -> bytes:
    import json

    import orjson

    from tests.capture_dirs import token_line
    line = orjson.loads(token_line([1], generated or [5], n=n, call_id=f"c{call}"))
    response = line["response"]
    if not generated:
        for choice in response["choices"]:
            choice["token_ids"], choice["logprobs"]["content"] = [], []
    if encoding == "float" and prompt:
        prompt = prompt[:-1] + [float(prompt[-1])]
    elif encoding == "bool":
        prompt = prompt + [True]
    elif encoding == "negative":
        prompt = prompt + [-3]
    response["prompt_token_ids"] = prompt
    if encoding == "per-choice":  # Completions: the prompt on each choice, none on the response.
        del response["prompt_token_ids"]
        for choice in response["choices"]:
            choice["prompt_token_ids"] = prompt
    elif encoding == "request-too":
        line["request"]["prompt_token_ids"] = prompt
    elif encoding == "message":  # NeMo RL's worker: the arrays on the message.
        del response["prompt_token_ids"]
        for choice in response["choices"]:
            choice["message"]["prompt_token_ids"] = prompt
    if encoding == "spaces":
        return json.dumps(line).encode() + b"\n"
    return orjson.dumps(line) + b"\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rollouts=st.lists(st.lists(_TURN, min_size=1, max_size=6), min_size=1, max_size=3),
       ending=st.sampled_from(["", "torn", "spaces", "commas", "unclosed", "blank"]))
@example(rollouts=[[("fresh", [1, 2], "orjson", 1), ("equals", [3], "orjson", 2), ("extends", [4], "orjson", 1)]], ending="")
def test_read_tasks_place_every_rollout_shape_as_the_reader_does(tmp_path_factory, rollouts, ending):
    directory = tmp_path_factory.mktemp("captures")
    for number, turns in enumerate(rollouts):
        lines, sequences, prompt = [], [], []
        for call, (how, added, encoding, n) in enumerate(turns):
            generated = added
            if how == "extends" and sequences:
                prompt = sequences[-1] + added[:2]
            elif how == "equals" and sequences:
                prompt = list(sequences[-1])
            elif how == "extends-older" and sequences:
                prompt = sequences[0] + added[:1]
            elif how == "drifts" and sequences:
                prompt = sequences[-1][:-1] + [7] + added[:1]
            elif how == "digit-more" and sequences:  # Its JSON begins with the earlier one's, its ids do not.
                prompt = sequences[-1][:-1] + [sequences[-1][-1] * 10 + 1] + added[:1]
            elif how == "fresh":
                prompt = list(added)
            elif how == "empty":
                prompt = []
            # "same": the previous prompt again.
            lines.append(_turn_line(prompt, generated, encoding, n, call))
            if prompt and generated and encoding in ("orjson", "spaces", "request-too", "per-choice", "message"):
                sequences.append(prompt + generated)
        data = b"".join(lines)
        data += {"": b"", "torn": b'{"model_call_id":"cut","response":{"prompt_token_ids":[1,2',
                 "spaces": b'{"response": {"prompt_token_ids": [1,,2]}}\n',
                 "commas": b'{"response":{"prompt_token_ids":[1,,2],"choices":[{"token_ids":[3]}]}}\n',
                 "unclosed": b'{"response":{"choices":[{}],"prompt_token_ids":[1,2}}\n', "blank": b"\n  \n"}[ending]
        (directory / f"p-{number}.capture.jsonl").write_bytes(data)
    files = [path for path, _ in capture_files(str(directory))]
    rows = sorted((row for table in read_group(files, "tokens") for row in table.to_pylist()), key=sort_key)
    assert rows == sorted(expected_token_rows(str(directory)), key=sort_key)


def test_an_id_past_int64_makes_its_row_unusable_not_the_read_fail(tmp_path):
    """Arrow's list<int64> cannot hold 2**63: the row says so (the reader, with Python ints, does not)."""
    from tests.capture_dirs import token_line
    directory = tmp_path / "captures"
    directory.mkdir()
    (directory / "big.capture.jsonl").write_bytes(
        token_line([5, 2**63], [7, 8]) + token_line([5, 2**63, 7, 8, 9], [2**64 - 1], turn=1) + token_line([1, 2], [3]))
    files = [path for path, _ in capture_files(str(directory))]
    rows = sorted((row for table in read_group(files, "tokens") for row in table.to_pylist()), key=sort_key)
    assert [(r["prompt_token_ids"], r["generation_token_ids"], r["usable"]) for r in rows] == [
        (None, [7, 8], False), (None, None, False), ([1, 2], [3], True)]
    assert rows[0]["problem"] == "prompt_token_ids has an id outside int64 (Arrow's list<int64> cannot hold it)"
    assert rows[1]["extends"] == 0, "placed by the reader's rule all the same"
    assert [r["usable"] for r in expected_token_rows(str(directory))] == [True, True, True]


def test_another_choice_of_the_same_call_is_no_earlier_turn(tmp_path):
    """Completions put a prompt on each choice: choice 1's prompt beginning with choice 0's prompt +
    generation extends nothing (the reader's rule), and the next call extends either."""
    import orjson
    line = {"model_call_id": "c", "response": {"object": "text_completion", "choices": [
        {"index": 0, "finish_reason": "stop", "prompt_token_ids": [1, 2], "token_ids": [3],
         "logprobs": {"token_logprobs": [-0.5], "tokens": ["a"]}},
        {"index": 1, "finish_reason": "stop", "prompt_token_ids": [1, 2, 3], "token_ids": [4],
         "logprobs": {"token_logprobs": [-0.5], "tokens": ["b"]}}]}}
    following = {"model_call_id": "d", "response": {"object": "chat.completion", "prompt_token_ids": [1, 2, 3, 4, 9],
                                                    "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [5],
                                                                 "logprobs": {"content": [{"token": "x", "logprob": -1.0}]}}]}}
    directory = tmp_path / "captures"
    directory.mkdir()
    (directory / "n2.capture.jsonl").write_bytes(orjson.dumps(line) + b"\n" + orjson.dumps(following) + b"\n")
    files = [path for path, _ in capture_files(str(directory))]
    rows = sorted((row for table in read_group(files, "tokens") for row in table.to_pylist()), key=sort_key)
    assert rows == sorted(expected_token_rows(str(directory)), key=sort_key)
    assert [(r["call_index"], r["choice_index"], r["extends"], r["drift_at"]) for r in rows] == [
        (0, 0, None, None), (0, 1, None, None), (1, 0, 0, None)]


@pytest.mark.slow
async def test_trajectory_rows_are_records_trajectories(tmp_path, local_ray, http, upstream, start):
    """``kind="trajectories"``: one row per chain of each rollout with a token file, as
    `records.trajectories` builds it (logprobs 0 where the loss mask is 0); masked rollouts marked."""
    from records import trajectories
    from tests.proxy.training.test_token_files import converse, serve_model
    from tests.vllm_chat_model import TinyChatModel
    directory = str(tmp_path / "captures")
    serve_model(upstream, TinyChatModel())
    sidecar = await start(upstream.url, capture_dir=directory, capture_tokens=True)
    await converse(http, sidecar, "clean", ["hi", "more", "thanks"])
    serve_model(upstream, TinyChatModel(drop_assistant_turns=True))
    await converse(http, sidecar, "drift", ["hi", "more"])
    rows = {row["rollout_id"]: row for row in ray_dataset(directory, kind="trajectories").take_all()}
    assert set(rows) == {"clean", "drift"}
    clean, build = rows["clean"], trajectories(directory, "clean")
    main = build.main
    assert (list(clean["token_ids"]), list(clean["loss_mask"]), clean["masked"]) == (main.token_ids, main.loss_mask, False)
    assert list(clean["logprobs"]) == [0.0 if value is None else value for value in main.logprobs]
    assert list(clean["call_ids"]) == [call.model_call_id for call in main.calls]
    assert [list(clean["call_starts"]), list(clean["call_ends"])] == [[c.start for c in main.calls], [c.end for c in main.calls]]
    assert rows["drift"]["masked"] is True and rows["drift"]["mask_reason"] == trajectories(directory, "drift").mask_reason


@pytest.mark.parametrize("kind", ["calls", "tokens"])
def test_a_store_url_reads_as_its_compacted_view_each_task_on_its_own_node(tmp_path, local_ray, kind):
    """A capture store (issue 46): the read tasks are planned from its manifests, so no node needs a
    volume another wrote: for calls a task per segment, each read alone (its lines' call indexes
    from the manifests); for the training kinds, whose rows follow a rollout's chain, tasks of
    rollouts rebuilt where they run. The rows equal those of the store's compacted directory."""
    import orjson

    from capture.journal import Uploader
    from records.store import compact_store
    from tests.capture_dirs import make_conversation_dir
    directory = str(tmp_path / "captures")
    make_conversation_dir(directory)
    spool, url = str(tmp_path / "spool"), f"segments://{tmp_path}/store"
    store = CaptureStore(directory)
    for writer, first in (("host.1.aaaa", 0), ("host.2.bbbb", 1)):  # Each rollout's calls split between two writers.
        segment_dir = os.path.join(spool, "segments", writer)
        os.makedirs(segment_dir)
        with open(os.path.join(segment_dir, "0000000001.sealed"), "wb") as handle:
            for rollout_id in store.rollout_ids():
                lines = store.read_available(rollout_id).lines[first::2]
                handle.write(b"".join(rollout_id.encode() + b"\t" + orjson.dumps(line) + b"\n" for line in lines))
    assert Uploader(spool, url).upload_all() == 2
    compacted = compact_store(url, str(tmp_path / "compacted"))
    dataset = ray_dataset(url, kind=kind, target_bytes_per_task=1)
    got = sorted(dataset.take_all(), key=sort_key)
    want = sorted(ray_dataset(compacted, kind=kind).take_all(), key=sort_key)
    assert len(got) == len(want) > 0 and got == want
    if kind == "calls":
        store_dir = tmp_path / "store"
        assert sorted(dataset.input_files()) == sorted(f"{url}#{path.relative_to(store_dir)}"
                                                        for path in (store_dir / "segments").rglob("*.jsonl"))
    else:
        assert sorted(dataset.input_files()) == sorted(f"{url}#{rollout_id}" for rollout_id in store.rollout_ids())
