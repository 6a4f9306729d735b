"""`mcc report` and `mcc export`."""

from __future__ import annotations

import logging
import os
import signal
import socket
from typing import Any, Optional

import click
import orjson

from .cli import OneSentence, _rollouts_or_say_empty, _store, progress
from .file_modes import made_private, permissions_option, writing_privately


@click.command("report")
@click.argument("directory", metavar="DIR")
@click.option("-o", "--output", default="report.html", show_default=True, help="The HTML file to write.")
@click.option("--rollout", "pattern", metavar="GLOB", help="Only rollouts whose id matches this glob.")
@permissions_option
def report_command(directory: str, output: str, pattern: Optional[str], permissions: str) -> None:
    """Write an HTML report (opens from disk, no network): the page, and the calls' payloads
    beside it in <name>_files/ (keep the two together)."""
    from .report import payload_dir, write_report

    _writable_parent(output)
    writing_privately(permissions)  # The whole prompts and replies: as private as the captures.
    click.get_current_context().call_on_close(lambda: made_private(permissions, output, payload_dir(output)))
    store = _store(directory)
    rollout_ids = _rollouts_or_say_empty(store, pattern)
    with progress(len(rollout_ids), "writing the report") as bar:
        sizes = write_report(store, rollout_ids, output, bar.update)
    click.echo(f"wrote {output} ({_size(sizes['page_bytes'])}) and {payload_dir(output)}/ "
               f"({_size(sizes['payload_bytes'])} of payloads): {len(rollout_ids)} rollouts")


def _export_receipts(store: Any, rollout_ids: list[str], output: str, key_file: Optional[str],
                     metadata: dict[bytes, bytes]) -> int:
    """Receipts (`receipts`): JSON lines, or Parquet when ``output`` ends in ``.parquet``."""
    from .receipts import RECEIPT_FIELDS, ReceiptKeyMissing, receipt_key, receipts_of

    try:
        key = receipt_key(key_file)
    except ReceiptKeyMissing as exc:
        raise OneSentence(str(exc)) from None
    rows: list[dict[str, Any]] = []
    with progress(len(rollout_ids), "exporting") as bar:
        for rid in rollout_ids:
            rows.extend(receipts_of(store, rid, key))
            bar.update(1)
    if output.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq

            from records.training import arrow_schema, to_arrow
        except ImportError:
            from .export import PYARROW_HINT
            raise click.ClickException(PYARROW_HINT) from None
        schema = arrow_schema(RECEIPT_FIELDS).with_metadata(metadata)
        pq.write_table(to_arrow({name: [row[name] for row in rows] for name, _ in RECEIPT_FIELDS}, schema), output)
    else:
        with open(output, "wb") as handle:
            handle.writelines(orjson.dumps(row) + b"\n" for row in rows)
    return len(rows)


def _size(count: int) -> str:
    """Bytes as a person reads them: KB under a megabyte (a small report is not '0.1 MB')."""
    return f"{count / 1e6:,.1f} MB" if count >= 1e6 else f"{max(1, round(count / 1e3)):,} KB"


def _writable_parent(output: str) -> None:
    """One sentence (exit 2) when ``output`` cannot be written, before any work is done."""
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise OneSentence(f"cannot write {output}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise OneSentence(f"cannot write {output}: the directory {parent} is not writable")


@click.command("export")
@click.argument("directory", metavar="DIR")
@click.option("--format", "kind", type=click.Choice(["parquet", "otel-json", "atif", "receipts"]), required=True,
              help="parquet: one row per call (columns in the README). otel-json: OTLP/JSON NDJSON, one "
                   "ExportTraceServiceRequest per line (a rollout, or up to 1,000 of its spans), for a collector's /v1/traces. "
                   "atif: one ATIF v1.7 trajectory per rollout, one JSON document a line (records.to_atif). "
                   "receipts: per call its ids, timings, status, token counts, tool names, sizes and keyed digests of "
                   "the request and reply, no text (JSON lines; Parquet when -o ends in .parquet; the key: "
                   "MCC_RECEIPT_KEY or --receipt-key-file; docs/privacy.md).")
@click.option("-o", "--output", required=True, help="The file to write.")
@click.option("--rollout", "pattern", metavar="GLOB", help="Only rollouts whose id matches this glob.")
@click.option("--token-arrays", is_flag=True,
              help="Parquet: add prompt_token_ids, generation_token_ids, generation_log_probs (one row per call and choice; large).")
@click.option("--output-text", is_flag=True, help="Parquet: add output_text, the reply's answer text (large).")
@click.option("--trajectories", is_flag=True,
              help="Parquet: one row per chain of each rollout with a training-token file (records.trajectories: "
                   "token_ids, loss_mask, logprobs, call spans, masked and why), instead of one per call.")
@click.option("--otel-compat", is_flag=True,
              help="otel-json: also write the cache-write count under gen_ai.usage.cache_creation.input_tokens, the "
                   "name the opentelemetry-semantic-conventions Python package still has (beside today's cache_write).")
@click.option("--ray", "ray_address", metavar="ADDRESS",
              help="Parquet, for a directory too big for one process: read it with records.ray_dataset on this Ray "
                   "cluster ('auto', 'head:6379', 'ray://head:10001', or 'local' to start one here) and write -o as a "
                   "directory of Parquet files, on a volume every node mounts: each read task writes its own file "
                   "(rows as ray_dataset's; needs the ray extra; deploy/README.md has the cluster's commands).")
@click.option("--receipt-key-file", metavar="FILE", help="receipts: the digests' key, hex of 32 bytes or more "
                                                           "(else MCC_RECEIPT_KEY; never a flag).")
@permissions_option
def export_command(directory: str, kind: str, output: str, pattern: Optional[str], token_arrays: bool,
                   output_text: bool, trajectories: bool, otel_compat: bool, ray_address: Optional[str],
                   receipt_key_file: Optional[str], permissions: str) -> None:
    """Export one row per call as Parquet, or OpenTelemetry GenAI spans as OTLP/JSON lines.

    This reads in one process. For a whole training run (millions of calls, many sidecars) use
    --ray, or records.ray_dataset in your own Ray job (README, "A whole run on Ray Data").
    """
    from records.training import rollout_rows_of

    writing_privately(permissions)  # As private as the captures it is read from.
    click.get_current_context().call_on_close(lambda: made_private(permissions, output))

    from .export import export_metadata, otel_lines, tool_version_string, write_parquet
    from .tables import iter_call_rows

    if (token_arrays or output_text or trajectories) and kind != "parquet":
        raise click.UsageError("--token-arrays, --output-text and --trajectories go with --format parquet")
    if otel_compat and kind != "otel-json":
        raise click.UsageError("--otel-compat goes with --format otel-json")
    if trajectories and (token_arrays or output_text):
        raise click.UsageError("--trajectories writes one row per chain: without --token-arrays or --output-text")
    if ray_address is not None:
        if kind != "parquet" or output_text or pattern:
            raise click.UsageError("--ray writes Parquet, without --output-text or --rollout")
        _writable_parent(output)
        _store(directory)
        count = _export_on_ray(directory, output, ray_address,
                               "trajectories" if trajectories else "call_tokens" if token_arrays else "calls",
                               export_metadata(directory, click.get_current_context()))
        click.echo(f"wrote {output}/: {count:,} rows")
        return
    _writable_parent(output)
    store = _store(directory)
    rollout_ids = _rollouts_or_say_empty(store, pattern)
    if kind == "receipts":
        count = _export_receipts(store, rollout_ids, output, receipt_key_file,
                                 export_metadata(directory, click.get_current_context()))
        click.echo(f"wrote {output}: {count:,} receipts (no text; keyed digests)")
        return
    if kind == "atif":
        from records import to_atif

        with open(output, "wb") as handle, progress(len(rollout_ids), "exporting") as bar:
            for rid in rollout_ids:
                handle.write(orjson.dumps(to_atif(store, rid, agent_version=tool_version_string())) + b"\n")
                bar.update(1)
        click.echo(f"wrote {output}: {len(rollout_ids):,} ATIF trajectories")
        return
    if kind == "otel-json":
        count = 0
        with open(output, "wb") as handle, progress(len(rollout_ids), "exporting") as bar:
            for rid in rollout_ids:
                calls = list(iter_call_rows(store, rid))
                handle.writelines(otel_lines([(rid, calls)], compat=otel_compat))
                count += len(calls)
                bar.update(1)
        click.echo(f"wrote {output}: {count:,} calls in {len(rollout_ids):,} traces")
        return
    if trajectories:
        count = _export_trajectories(store, rollout_ids, output, export_metadata(directory, click.get_current_context()))
        click.echo(f"wrote {output}: {count:,} chains")
        return
    # The rows a `--ray` export's read tasks give (`records.training.rollout_rows_of`): one schema for one command.
    dataset_kind = "call_tokens" if token_arrays else "calls"
    rows: list[dict[str, Any]] = []
    with progress(len(rollout_ids), "reading") as bar:
        for rid in rollout_ids:
            found = rollout_rows_of(store.capture_dir, rid, dataset_kind)
            if output_text:
                texts = {row.call_index: row.output_text for row in iter_call_rows(store, rid, output_text=True)}
                for row in found:
                    row["output_text"] = texts.get(row["call_index"])
            rows.extend(found)
            bar.update(1)
    try:
        count = write_parquet(rows, output, dataset_kind, output_text=output_text,
                              metadata=export_metadata(directory, click.get_current_context()))
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {output}: {count:,} rows")


def _export_trajectories(store: Any, rollout_ids: list[str], output: str, metadata: dict[bytes, bytes]) -> int:
    """The rollouts' chains as ``ray_dataset(kind="trajectories")`` gives them, in one Parquet file."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise click.ClickException("Parquet export needs pyarrow: pip install pyarrow") from None
    from records.training import ROLLOUT_COLUMNS, TRAJECTORY_COLUMNS, arrow_schema, trajectory_rows

    rows = []
    with progress(len(rollout_ids), "building trajectories") as bar:
        for rid in rollout_ids:
            rows += trajectory_rows(store.capture_dir, rid)
            bar.update(1)
    pq.write_table(_table(rows, arrow_schema(TRAJECTORY_COLUMNS + ROLLOUT_COLUMNS).with_metadata(metadata)), output)
    return len(rows)


def _table(rows: list[dict[str, Any]], schema: Any) -> Any:
    from records.training import to_arrow
    return to_arrow({field.name: [row[field.name] for row in rows] for field in schema}, schema)


def _export_on_ray(directory: str, output: str, address: str, kind: str, metadata: dict[bytes, bytes]) -> int:
    """`records.ray_dataset` written as a directory of Parquet files; the rows written."""
    try:
        import pyarrow.parquet as pq
        import ray  # noqa: F401
    except ImportError:
        raise click.ClickException("--ray needs Ray Data: pip install 'ray[data]' (the ray extra)") from None
    from records import ray_dataset

    _connect_to_ray(address)
    from ray.data import DataContext
    DataContext.get_current().print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    dataset = ray_dataset(directory, kind=kind)
    # Each file says where it came from, as the one-process export's does (fused into the read).
    dataset.map_batches(lambda table: table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata}),
                        batch_format="pyarrow", zero_copy_batch=True).write_parquet(output)
    return sum(pq.ParquetFile(os.path.join(output, name)).metadata.num_rows
               for name in os.listdir(output) if name.endswith(".parquet"))


#: How long a cluster's address may take to accept a connection before `--ray` says it cannot be
#: reached (Ray itself retries for minutes, silently, at an address where nothing listens).
_RAY_CONNECT_SECONDS = 5.0


def _connect_to_ray(address: str) -> None:
    """``ray.init`` for ``--ray ADDRESS``, with what went wrong said in one sentence.

    ``local`` is passed to Ray as it is: it starts a Ray here even where ``ray start`` left a
    cluster's address behind (``ray.init()`` without an address would connect to that one). A
    ``host:port`` or ``ray://host:port`` is reached first, so that a wrong address is said at once;
    so is the address ``auto`` stands for ($RAY_ADDRESS, else the last ``ray start``'s, which a
    killed session leaves behind: Ray would retry it for many minutes). Ctrl-C ends the connect.
    """
    import ray
    from ray.exceptions import RayError

    if ray.is_initialized():
        return
    target = _resolve_auto() if address == "auto" else address
    endpoint = target[len("ray://"):] if target.startswith("ray://") else target
    host, _, port = endpoint.rpartition(":")
    if target != "local" and host and port.isdigit():
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=_RAY_CONNECT_SECONDS).close()
        except OSError as exc:
            named = address if target == address else f"{address} ({target}, the address it finds)"
            raise OneSentence(f"cannot reach the Ray cluster at {named}: {exc.strerror or exc} (is `ray start "
                              "--head` running there, and its port open to this machine?)") from None
    interrupt = signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ray's connect loop never returns to Python.
    try:
        # Ray's INFO lines (connecting, dashboard, each dataset's plan) are not the command's: quiet.
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, RayError) as exc:
        hint = ("; is this machine's token the cluster's (RAY_AUTH_TOKEN, or ~/.ray/auth_token)?"
                if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else
                "; if the cluster uses token authentication (Ray 2.60's `ray start --head` turns it on), set "
                "RAY_AUTH_MODE=token and give this machine the cluster's token (RAY_AUTH_TOKEN, or "
                "~/.ray/auth_token; `ray get-auth-token` on the head prints it)")
        raise click.ClickException(f"cannot connect to the Ray cluster at {address}: {exc}{hint}") from None
    finally:
        signal.signal(signal.SIGINT, interrupt)


def _resolve_auto() -> str:
    """The address ``--ray auto`` means, as Ray finds it; one sentence when there is none."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
        found = canonicalize_bootstrap_address("auto")
    except ConnectionError:
        found = None
    except Exception:  # Ray's own lookup changed or failed: ray.init says why.
        return "auto"
    if found is None:
        raise OneSentence("no running Ray cluster found for --ray auto (no RAY_ADDRESS, no `ray start` on this "
                          "machine): name one (--ray head:6379), set RAY_ADDRESS, or use --ray local")
    return found


@click.command("redact")
@click.argument("source", metavar="SRC")
@click.argument("target", metavar="DST")
@click.option("--redact", "rules_file", metavar="FILE", help="Redaction rules, as the sidecar's --redact (docs/privacy.md).")
@click.option("--redact-hook", "hook", metavar="MODULE:FUNCTION", help="A callable given every text value after the "
                                                                         "rules, as the sidecar's --redact-hook.")
@click.option("--redact-hook-budget", "budget", type=float, default=1.0, show_default=True,
              help="Seconds the hook may take per line; past it the line is written metrics-only, marked.")
@click.option("--privacy", type=click.Choice(["full", "metrics-only"]), default="full", show_default=True,
              help="metrics-only: no text at all, and no token files.")
@permissions_option
def redact_command(source: str, target: str, rules_file: Optional[str], hook: Optional[str], budget: float,
                   privacy: str, permissions: str) -> None:
    """Write a redacted copy of the capture directory or store SRC into the directory DST (new or
    empty): what was captured before the rules existed, redacted as live capture would have
    (placeholders keyed by MCC_REDACT_KEY: the sidecars' key gives their placeholders). SRC is only
    read. From a store, its lines (as `mcc compact` writes them)."""
    from capture import RedactionConfigError

    from ..privacy import load_redaction
    from .redact_copy import redact_copy

    if not rules_file and not hook and privacy == "full":
        raise click.UsageError("give --redact FILE, --redact-hook MODULE:FUNCTION or --privacy metrics-only")
    from records.contract.reading import is_store_url
    store_url = source if is_store_url(source) else None
    if store_url is None and not os.path.isdir(source):
        raise OneSentence(f"{source} is neither a capture directory nor a store URL")
    try:
        rules, function = load_redaction(rules_file, hook)
    except RedactionConfigError as exc:
        raise OneSentence(str(exc)) from None
    key_text = os.environ.get("MCC_REDACT_KEY", "").strip()
    try:
        key = bytes.fromhex(key_text) if key_text else None
    except ValueError:
        raise OneSentence("MCC_REDACT_KEY is not hex (32 bytes or more: `openssl rand -hex 32`)") from None
    writing_privately(permissions)
    import shutil
    import tempfile
    staged = tempfile.mkdtemp(prefix="mcc-redact-") if store_url is not None else None
    try:
        if store_url is not None and staged is not None:  # Its lines as Gym's files, private, gone after.
            from records.store import compact_store
            source = compact_store(store_url, staged)
        done = redact_copy(source, target, rules, function, budget, privacy == "metrics-only", key)
    except ValueError as exc:
        raise OneSentence(str(exc)) from None
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)
    made_private(permissions, target)
    replaced = ", ".join(f"{rule} {count:,}" for rule, count in sorted(done.replaced.items())) or "none"
    click.echo(f"wrote {target}: {done.lines:,} lines ({privacy}); values replaced: {replaced}; "
               f"{done.failed:,} written metrics-only (the hook failed); {done.unreadable:,} unreadable lines left out; "
               f"{done.copied:,} files without text copied"
               + ("" if key is not None else "; placeholders keyed by a key drawn now (set MCC_REDACT_KEY to match a "
                                             "sidecar's)"))
