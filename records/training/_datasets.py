"""Capture files as a Ray Data dataset: a whole run, read in parallel across a cluster (issue 24).

``ray_dataset(paths, kind="calls")`` is one row per call with the Parquet export's columns
(`CALL_COLUMNS`); ``kind="tokens"`` one row per call and choice with the `TokenRecord` fields
(`TOKEN_COLUMNS`: the arrays, ``usable`` and why not, multi-turn drift). The rows are what
`records`' own readers give for the same files -- the same tolerant read (a torn or malformed
line is skipped, and counted in ``rollout_unreadable_lines``), the same drift tracking within a
rollout -- plus what a run-wide dataset needs to tell rollouts apart: ``rollout_incomplete`` (the
``.capture.incomplete`` marker) and the rollout id split into ``rollout_base`` and ``attempt``
(``-a<n>``, `split_attempt`).

Files are listed once, by the caller, then read by Ray tasks: a task reads a group of whole files
(grouped up to ``target_bytes_per_task``, so small rollouts do not each cost a task, and split
finer when Ray asks for more parallelism), one file at a time, yielding Arrow blocks of bounded
size. A task's memory is therefore bounded by its largest file and one block, never by the run.
Every node reads the paths itself: the capture volume must be mounted at the same path on each.

Ray and pyarrow are imported when a dataset is made (the ``ray`` extra, installed from the
checkout or its wheel: ``pip install "model-call-capture[ray] @ file:///path/to/checkout"``);
`records` itself never needs them.
"""

from __future__ import annotations

import inspect
import math
import os
import tempfile
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Optional, Sequence, Union

from ..store import CALL_COLUMNS, call_row, with_arrow_times
from ..contract import CAPTURE_SUFFIX, INCOMPLETE_SUFFIX
from ..contract import is_valid_rollout_id
from ..contract.reading import split_attempt
from ..contract.reading import is_store_url
from ..store import directory_of
from ..store import SegmentRead, plan_segment_reads, store_rollout_sizes, store_view
from ..store import CaptureStore, gc_paused
from ..contract.reading import TOKENS_SUFFIX
from ..contract import TokenRecord
from ._token_records_reading import iter_token_records
from ._routed_experts_reading import read_routed_experts
from ._token_rows import TOKEN_COLUMNS, token_row

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow
    import ray.data

#: Columns every row of both kinds ends with: which rollout and attempt, and what its file said.
ROLLOUT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("rollout_base", "string"), ("attempt", "int64"), ("rollout_incomplete", "bool"),
    ("rollout_unreadable_lines", "int64"),
)
#: The columns of ``kind="trajectories"``: one row per chain of a rollout (`records.trajectories`),
#: the main chain first; each call's id and generated span as parallel lists.
TRAJECTORY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("rollout_id", "string"), ("chain_id", "string"), ("token_ids", "list<int64>"), ("loss_mask", "list<int64>"),
    ("logprobs", "list<float64>"), ("call_ids", "list<string>"), ("call_starts", "list<int64>"),
    ("call_ends", "list<int64>"), ("masked", "bool"), ("mask_reason", "string"),
    # Per token, the weight version that sampled it (null on prompt tokens); the labels in order.
    ("weight_versions", "list<string>"), ("weight_version_labels", "list<string>"),
    # MoE routed experts (``--capture-routed-experts``): the chain's, aligned with its tokens, as
    # ``.npy`` bytes (``numpy.load(io.BytesIO(row["routed_experts"]))``), verified; null when none.
    ("routed_experts", "binary"),
)
#: The columns of ``kind="call_tokens"`` (`mcc export --token-arrays`): a call's columns, then one of
#: its choices' training arrays and verdicts (``source`` and ``problem`` named for the arrays).
CALL_TOKEN_COLUMNS: tuple[tuple[str, str], ...] = CALL_COLUMNS + (
    ("choice_index", "int64"), ("prompt_token_ids", "list<int64>"), ("generation_token_ids", "list<int64>"),
    ("generation_log_probs", "list<float64>"), ("token_source", "string"), ("token_problem", "string"),
    ("missing", "list<string>"), ("usable", "bool"), ("unusable_reason", "string"), ("extends", "int64"),
    ("drift_at", "int64"), ("drift_from", "int64"),
)
KINDS = ("calls", "tokens", "trajectories", "call_tokens")
_COLUMNS = {"calls": CALL_COLUMNS, "tokens": TOKEN_COLUMNS, "trajectories": TRAJECTORY_COLUMNS,
            "call_tokens": CALL_TOKEN_COLUMNS}
#: A read task's files add up to about this much (one larger file is a task of its own). A task
#: costs Ray Data a round trip to its driver before the next starts (~0.2 s on a busy node, with
#: its default resource reservation): a few seconds of reading a task keeps that small. Memory
#: does not grow with it: a task reads one file at a time (see `read_group`).
TARGET_BYTES_PER_TASK = 256 * 1024 * 1024
#: A block is yielded once it holds this many rows, or this many token ids and logprobs.
BLOCK_ROWS, BLOCK_VALUES = 4096, 1_000_000


def arrow_schema(columns: Iterable[tuple[str, str]]) -> "pyarrow.Schema":
    """The Arrow schema of `CALL_COLUMNS`, `TOKEN_COLUMNS` or `ROLLOUT_COLUMNS` (timestamps in UTC)."""
    import pyarrow as pa

    types = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(),
             "timestamp": pa.timestamp("us", tz="UTC"), "list<string>": pa.list_(pa.string()),
             "list<int64>": pa.list_(pa.int64()), "list<float64>": pa.list_(pa.float64()), "binary": pa.binary()}
    return pa.schema([(name, types[kind]) for name, kind in columns])


def capture_files(paths: Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]) -> list[tuple[str, int]]:
    """Every capture file (and marker-only rollout) under ``paths``, as ``(path, bytes)``, sorted.

    A path may be a capture directory or one ``.capture.jsonl`` file. A rollout with only its
    ``.capture.incomplete`` marker is listed by its would-be file (0 bytes): it has no rows, as
    with `records`' readers, but its loss is not silent (`mcc ls` and the attachment's gaps show it).
    A path that does not exist raises `FileNotFoundError`, as `CaptureStore` does.
    """
    # One directory, file or store, or several (anything else is refused by `directory_of`).
    listed: list[Any] = list(paths) if isinstance(paths, (list, tuple)) else [paths]
    found: dict[str, int] = {}
    for path in (directory_of(path, "capture_files") for path in listed):
        if os.path.isdir(path):
            for name in os.listdir(path):
                for suffix in (CAPTURE_SUFFIX, INCOMPLETE_SUFFIX):
                    if name.endswith(suffix) and is_valid_rollout_id(name[: -len(suffix)]):
                        file = os.path.join(path, name[: -len(suffix)] + CAPTURE_SUFFIX)
                        found.setdefault(file, _size(file))
        elif path.endswith(CAPTURE_SUFFIX) and os.path.exists(path):
            found[path] = _size(path)
        else:
            raise FileNotFoundError(f"{path} is neither a capture directory nor a {CAPTURE_SUFFIX} file "
                                    "(a wrong path, or a volume not mounted here?)")
    return sorted(found.items())


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


#: However much parallelism Ray asks for, a task reads at least this much (when there is): below
#: it, a task's own cost (scheduling, a worker's start of the read) shows beside its work.
MIN_BYTES_PER_TASK = 16 * 1024 * 1024


def group_files(files: list[tuple[str, int]], parallelism: int,
                target_bytes: int = TARGET_BYTES_PER_TASK) -> list[list[tuple[str, int]]]:
    """Files in read groups of about equal bytes, in order: as many groups as ``target_bytes``
    needs, more when ``parallelism`` asks for more (while each keeps `MIN_BYTES_PER_TASK`); a file
    is never split, so a group holds about ``target_bytes``, give or take a file.

    Equal groups matter more than their exact size: a run's last task sets when it ends, and a
    small remainder group would leave the other CPUs idle. The same files and parallelism give the
    same groups, and asking again with their count gives them again (Ray asks with the count
    `ray_dataset` chose)."""
    total = sum(size for _, size in files)
    if not files:
        return []
    count = max(1, math.ceil(total / target_bytes))
    if parallelism > count:
        count = max(count, min(parallelism, total // MIN_BYTES_PER_TASK))
    groups: list[list[tuple[str, int]]] = [[] for _ in range(min(count, len(files)))]
    start = 0
    for file, size in files:
        # A file goes to the group its middle byte falls in, were the bytes cut into equal parts.
        middle = start + size / 2
        groups[min(len(groups) - 1, int(middle * len(groups) / total)) if total else 0].append((file, size))
        start += size
    return [group for group in groups if group]


def _reader(items: Sequence[Any], kind: str) -> "Callable[[], Iterator[pyarrow.Table]]":
    """A read task's function: its items read as ``kind``."""
    def read() -> Iterator["pyarrow.Table"]:
        return read_items(items, kind)
    return read


def read_items(items: Sequence[Any], kind: str) -> Iterator["pyarrow.Table"]:
    """A read task's items: capture files; a store's segments (`SegmentRead`: ``kind="calls"``,
    each segment read alone, its lines' call indexes planned from the manifests); and
    ``(store URL, rollout id)`` pairs (the training kinds, whose rows follow a rollout's whole
    chain): those rollouts rebuilt on the task's own node (`store_view` into a directory of its
    own, from the segments that name them), so a cluster needs no shared volume."""
    paths = [item for item in items if isinstance(item, str)]
    if paths:
        yield from read_group(paths, kind)
    segments = [item for item in items if isinstance(item, SegmentRead)]
    if segments:
        yield from _blocks((row for segment in segments for row in segment_call_rows(segment)), kind)
    by_store: dict[str, list[str]] = {}
    for item in items:
        if isinstance(item, tuple):
            by_store.setdefault(item[0], []).append(item[1])
    for url, rollout_ids in by_store.items():
        with tempfile.TemporaryDirectory(prefix="mcc-store-read-") as directory:
            store_view(url, directory, rollout_ids)
            yield from read_group([os.path.join(directory, rollout_id + CAPTURE_SUFFIX) for rollout_id in rollout_ids],
                                  kind)


def segment_call_rows(segment: SegmentRead) -> Iterator[dict[str, Any]]:
    """The call rows of one segment's lines: those `rollout_rows_of` gives for the same lines of the
    store's view (the view holds only whole lines, so none is unreadable)."""
    columns: dict[str, dict[str, Any]] = {}
    with gc_paused():
        for rollout_id, call_index, line in segment.lines():
            if rollout_id not in columns:
                columns[rollout_id] = _rollout_columns(rollout_id, rollout_id in segment.incomplete, 0)
            row = with_arrow_times(call_row(rollout_id, call_index, line).as_dict())
            row.update(columns[rollout_id])
            yield row


def _rollout_columns(rollout_id: str, incomplete: bool, unreadable: int) -> dict[str, Any]:
    """The `ROLLOUT_COLUMNS` of every row of one rollout."""
    base, attempt = split_attempt(rollout_id)
    return {"rollout_base": base, "attempt": attempt, "rollout_incomplete": incomplete,
            "rollout_unreadable_lines": unreadable}


def read_group(files: Sequence[str], kind: str) -> Iterator["pyarrow.Table"]:
    """What one read task does with capture files: their rows as Arrow tables of bounded size
    (`BLOCK_ROWS`, `BLOCK_VALUES`), one file at a time."""
    def rows() -> Iterator[dict[str, Any]]:
        for path in files:
            directory, name = os.path.split(path)
            yield from rollout_rows_of(directory, name[: -len(CAPTURE_SUFFIX)], kind)

    return _blocks(rows(), kind)


def _blocks(rows: Iterable[dict[str, Any]], kind: str) -> Iterator["pyarrow.Table"]:
    """``rows`` as Arrow tables of bounded size (`BLOCK_ROWS`, `BLOCK_VALUES`)."""
    columns = _COLUMNS[kind] + ROLLOUT_COLUMNS
    schema = arrow_schema(columns)
    names = [name for name, _ in columns]
    block: dict[str, list[Any]] = {name: [] for name in names}
    count = values = 0
    for row in rows:
        for column in names:
            block[column].append(row[column])
        count += 1
        if kind == "tokens":
            values += sum(len(row[key]) for key in ("prompt_token_ids", "generation_token_ids",
                                                    "generation_log_probs") if row[key] is not None)
        elif kind == "trajectories":
            values += 2 * len(row["token_ids"])
        if count >= BLOCK_ROWS or values >= BLOCK_VALUES:
            yield to_arrow(block, schema)
            block, count, values = {name: [] for name in names}, 0, 0
    if count:
        yield to_arrow(block, schema)


def to_arrow(block: dict[str, list[Any]], schema: "pyarrow.Schema") -> "pyarrow.Table":
    """``block`` (a list per column) as an Arrow table. Lists of numbers go through numpy (a
    column's values may be numpy arrays already): Arrow's own conversion of Python ints is ~15x
    slower, and the token arrays are most of the data."""
    import numpy as np
    import pyarrow as pa

    arrays = []
    for field in schema:
        values = block[field.name]
        numbers = pa.types.is_list(field.type) and (pa.types.is_integer(field.type.value_type)
                                                    or pa.types.is_floating(field.type.value_type))
        if numbers:
            dtype = np.int64 if pa.types.is_integer(field.type.value_type) else np.float64
            lengths = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))
            offsets = np.zeros(len(values) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            present = [np.asarray(v, dtype=dtype) for v in values if v is not None and len(v)]
            flat = np.concatenate(present) if present else np.empty(0, dtype=dtype)
            mask = pa.array([v is None for v in values], type=pa.bool_())
            arrays.append(pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat), mask=mask).cast(field.type))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _call_rows(store: CaptureStore, rollout_id: str) -> tuple[list[dict[str, Any]], int]:
    rows, unreadable = [], 0
    with gc_paused():
        for index, line in store.iter_available(rollout_id):
            if line is None:
                unreadable += 1
            else:
                rows.append(with_arrow_times(call_row(rollout_id, index, line).as_dict()))
    _count_rows_from_entries(store, rollout_id, rows)
    return rows, unreadable


def _count_rows_from_entries(store: CaptureStore, rollout_id: str, rows: list[dict[str, Any]]) -> None:
    """Rows without usage whose call has a token capture mode entry: counted from it, as
    `records.read_model_call_records` counts its records (``token_counts``: ``counted``)."""
    if all(row["tokens_in"] is not None and row["tokens_out"] is not None for row in rows):
        return
    from ..store import counts_from_entries

    counts = counts_from_entries(store.capture_dir, rollout_id)
    for row in rows:
        counted = counts.get(row["model_call_id"]) if row["token_counts"] != "reported" else None
        if counted is not None:
            row["tokens_in"] = row["tokens_in"] if row["tokens_in"] is not None else counted[0]
            row["tokens_out"] = row["tokens_out"] if row["tokens_out"] is not None else counted[1]
            row["token_counts"] = "counted"


def _token_rows(store: CaptureStore, rollout_id: str) -> tuple[list[dict[str, Any]], int]:
    """As `iter_token_records`, with the unreadable lines counted and the arrays as numpy arrays
    (`RolloutTokenRows`: the same records, read without re-parsing each turn's repeated prompt)."""
    from ._token_arrays import RolloutTokenRows  # numpy: only where a read task runs.

    rows: list[dict[str, Any]] = []
    unreadable = 0
    if os.path.exists(os.path.join(store.capture_dir, rollout_id + TOKENS_SUFFIX)):
        # The token capture mode's lines leave their arrays to the token file: the reader's way.
        with gc_paused():
            for _, line in store.iter_available(rollout_id):
                unreadable += line is None
            rows = [token_row(record) for record in iter_token_records(store, rollout_id)]
        return rows, unreadable
    rollout = RolloutTokenRows(rollout_id)
    with gc_paused():  # Token rows are many big lists: a collection pass per few hundred is pure cost.
        for index, raw in store.iter_raw_lines(rollout_id):
            found = None if raw is None else rollout.rows_of_line(raw, index)
            if found is None:
                unreadable += 1
            else:
                rows.extend(found)
    return rows, unreadable


def rollout_rows_of(directory: str, rollout_id: str, kind: str) -> list[dict[str, Any]]:
    """The rows of one rollout a read task of ``kind`` gives, its `ROLLOUT_COLUMNS` included:
    what `mcc export` writes in one process too, so both give the same columns and rows."""
    read = {"calls": _call_rows, "tokens": _token_rows, "trajectories": _trajectory_rows,
            "call_tokens": _call_token_rows}[kind]
    directory = directory_of(directory, "rollout_rows_of")
    rows, unreadable = read(CaptureStore(directory), rollout_id)
    columns = _rollout_columns(rollout_id, os.path.exists(os.path.join(directory, rollout_id + INCOMPLETE_SUFFIX)),
                               unreadable)
    for row in rows:
        row.update(columns)
    return rows


def _call_token_rows(store: CaptureStore, rollout_id: str) -> tuple[list[dict[str, Any]], int]:
    """Each call's row once per choice with its training arrays (`TokenRecord`), a call without
    arrays once with none."""
    calls, unreadable = _call_rows(store, rollout_id)
    by_call: dict[int, list[TokenRecord]] = {}
    for record in iter_token_records(store, rollout_id):
        by_call.setdefault(record.call_index, []).append(record)
    rows = []
    for call in calls:
        for record in by_call.get(call["call_index"]) or [None]:  # type: ignore[list-item]  # None: a call without arrays
            row = dict(call)
            if record is None:
                row.update(choice_index=0, prompt_token_ids=None, generation_token_ids=None, generation_log_probs=None,
                           token_source=None, token_problem=None, missing=["prompt_token_ids", "generation_token_ids",
                                                                           "generation_log_probs"],
                           usable=False, unusable_reason="no token arrays captured", extends=None, drift_at=None,
                           drift_from=None)
            else:
                values = token_row(record)
                row.update(choice_index=values["choice_index"], prompt_token_ids=values["prompt_token_ids"],
                           generation_token_ids=values["generation_token_ids"],
                           generation_log_probs=values["generation_log_probs"], token_source=values["source"],
                           token_problem=values["problem"], missing=values["missing"], usable=values["usable"],
                           unusable_reason=values["unusable_reason"], extends=values["extends"],
                           drift_at=values["drift_at"], drift_from=values["drift_from"])
            rows.append(row)
    return rows, unreadable


def _trajectory_rows(store: CaptureStore, rollout_id: str) -> tuple[list[dict[str, Any]], int]:
    """The rollout's chains (`records.trajectories` of the token file beside its capture file);
    a masked rollout gives its chains too, each marked, or one empty row saying why. ``logprobs``
    holds 0 on prompt tokens (``loss_mask`` 0)."""
    from ._trajectories import trajectories

    build = trajectories(store.capture_dir, rollout_id)
    if not os.path.exists(os.path.join(store.capture_dir, rollout_id + TOKENS_SUFFIX)):
        return [], 0
    rows = [{"rollout_id": rollout_id, "chain_id": chain.chain_id, "token_ids": chain.token_ids,
             "loss_mask": chain.loss_mask,
             # 0 on prompt tokens (the loss mask says which are sampled): Arrow lists of numbers have no None.
             "logprobs": [0.0 if value is None else value for value in chain.logprobs],
             "call_ids": [call.model_call_id for call in chain.calls], "call_starts": [call.start for call in chain.calls],
             "call_ends": [call.end for call in chain.calls], "masked": build.masked, "mask_reason": build.mask_reason,
             "weight_versions": chain.weight_versions, "weight_version_labels": chain.weight_version_labels,
             "routed_experts": _routed_experts_npy(store, rollout_id, chain)}
            for chain in build.chains]
    if not rows:
        rows = [{"rollout_id": rollout_id, "chain_id": None, "token_ids": [], "loss_mask": [], "logprobs": [],
                 "call_ids": [], "call_starts": [], "call_ends": [], "masked": True, "mask_reason": build.mask_reason,
                 "weight_versions": None, "weight_version_labels": [], "routed_experts": None}]
    return rows, 0


def _routed_experts_npy(store: CaptureStore, rollout_id: str, chain: Any) -> Optional[bytes]:
    if not any(call.routed_experts is not None for call in chain.calls):
        return None
    aligned = read_routed_experts(store, rollout_id, chain)
    return None if aligned is None else aligned.to_npy()


def trajectory_rows(directory: str, rollout_id: str) -> list[dict[str, Any]]:
    """The rows ``kind="trajectories"`` gives for one rollout (with its `ROLLOUT_COLUMNS`)."""
    return rollout_rows_of(directory, rollout_id, "trajectories")


def ray_dataset(paths: Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]], kind: str = "calls", *,
                target_bytes_per_task: int = TARGET_BYTES_PER_TASK, override_num_blocks: Optional[int] = None,
                ray_remote_args: Optional[dict[str, Any]] = None) -> "ray.data.Dataset":
    """A Ray Data dataset of the captures under ``paths`` (directories or capture files).

    ``kind="calls"``: one row per call (`CALL_COLUMNS` + `ROLLOUT_COLUMNS`); ``kind="tokens"``:
    one row per call and choice (`TOKEN_COLUMNS` + `ROLLOUT_COLUMNS`); ``kind="trajectories"``: one
    row per chain of each rollout with a training-token file (`TRAJECTORY_COLUMNS` +
    `ROLLOUT_COLUMNS`; filter ``not masked`` for what a trainer takes). Lazy, as Ray datasets are:
    the files are listed now, read when the dataset executes. Needs Ray (the ``ray`` extra) and
    a cluster (``ray.init()``; a local one is started when none is).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    try:
        import ray
        import ray.data
    except ImportError:
        raise ImportError("ray_dataset needs Ray Data: pip install 'ray[data]' (or install this package from its "
                          "checkout with its ray extra: pip install \"model-call-capture[ray] @ file:///path/to/checkout\")") from None
    listed: list[Any] = list(paths) if isinstance(paths, (list, tuple)) else [paths]
    stores = [path for path in listed if is_store_url(path)]
    files: list[tuple[Any, int]] = capture_files([path for path in listed if not is_store_url(path)]) if len(stores) < len(listed) else []
    for url in stores:  # Planned from the store's manifests alone; no task needs a volume another wrote.
        segments = plan_segment_reads(url) if kind == "calls" else None
        if segments is not None:  # A read task per segment (or a few small ones), each read alone.
            files += [(segment, segment.size) for segment in segments]
        else:  # A rollout's chain needs its whole file: tasks of rollouts, each rebuilt on its node.
            files += [((url, rollout_id), size) for rollout_id, size in store_rollout_sizes(url).items()]
    if override_num_blocks is None:
        # As many blocks as read tasks: asked for more, Ray Data would split every task's output
        # (SplitBlocks), and its per-block cost shows beside a read this light.
        cpus = ray.cluster_resources().get("CPU", 1) if ray.is_initialized() else (os.cpu_count() or 1)
        override_num_blocks = max(1, len(group_files(files, int(2 * cpus), target_bytes_per_task)))
    source = _capture_datasource()(files, kind, target_bytes_per_task)
    options: dict[str, Any] = {"override_num_blocks": override_num_blocks}
    if ray_remote_args:
        options["ray_remote_args"] = ray_remote_args
    return ray.data.read_datasource(source, **options)


def _item_name(item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, SegmentRead):
        return f"{item.url}#{item.segment}"
    return f"{item[0]}#{item[1]}"


def _capture_datasource() -> type:
    """The `Datasource` class, made on first use so that Ray is imported only then."""
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    metadata_takes = set(inspect.signature(BlockMetadata).parameters)
    task_takes = set(inspect.signature(ReadTask.__init__).parameters)

    class CaptureDatasource(Datasource):
        def __init__(self, files: list[tuple[str, int]], kind: str, target_bytes: int) -> None:
            self.files, self.kind, self.target_bytes = files, kind, target_bytes

        def get_name(self) -> str:
            return f"ModelCallCapture({self.kind})"

        def estimate_inmemory_data_size(self) -> Optional[int]:
            return sum(size for _, size in self.files) or None

        # Ray's own signature has changed across the releases this reads with (options, per_task_row_limit).
        def get_read_tasks(self, parallelism: int, **options: Any) -> list[ReadTask]:  # type: ignore[override]  # as above
            schema = arrow_schema(_COLUMNS[self.kind] + ROLLOUT_COLUMNS)
            tasks = []
            for group in group_files(self.files, parallelism, self.target_bytes):
                paths = [path for path, _ in group]
                details = {"num_rows": None, "size_bytes": sum(size for _, size in group),
                           "input_files": [_item_name(p) for p in paths],
                           "exec_stats": None, "schema": schema}
                metadata = BlockMetadata(**{k: v for k, v in details.items() if k in metadata_takes})
                extra = {"schema": schema} if "schema" in task_takes else {}
                if options.get("per_task_row_limit") is not None and "per_task_row_limit" in task_takes:
                    extra["per_task_row_limit"] = options["per_task_row_limit"]
                tasks.append(ReadTask(_reader(paths, self.kind), metadata, **extra))
            return tasks

    return CaptureDatasource
