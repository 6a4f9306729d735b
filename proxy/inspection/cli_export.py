"""`mcc report` and `mcc export`."""

from __future__ import annotations

import os
from typing import Optional

import click

from .cli import OneSentence, _rollouts_or_say_empty, _store, progress


@click.command("report")
@click.argument("directory", metavar="DIR")
@click.option("-o", "--output", default="report.html", show_default=True, help="The HTML file to write.")
@click.option("--rollout", "pattern", metavar="GLOB", help="Only rollouts whose id matches this glob.")
def report_command(directory: str, output: str, pattern: Optional[str]) -> None:
    """Write an HTML report (opens from disk, no network): the page, and the calls' payloads
    beside it in <name>_files/ (keep the two together)."""
    from .report import payload_dir, write_report

    _writable_parent(output)
    store = _store(directory)
    rollout_ids = _rollouts_or_say_empty(store, pattern)
    with progress(len(rollout_ids), "writing the report") as bar:
        sizes = write_report(store, rollout_ids, output, bar.update)
    click.echo(f"wrote {output} ({sizes['page_bytes'] / 1e6:.1f} MB) and {payload_dir(output)}/ "
               f"({sizes['payload_bytes'] / 1e6:.1f} MB of payloads): {len(rollout_ids)} rollouts")


def _writable_parent(output: str) -> None:
    """One sentence (exit 2) when ``output`` cannot be written, before any work is done."""
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise OneSentence(f"cannot write {output}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise OneSentence(f"cannot write {output}: the directory {parent} is not writable")


@click.command("export")
@click.argument("directory", metavar="DIR")
@click.option("--format", "kind", type=click.Choice(["parquet", "otel-json"]), required=True,
              help="parquet: one row per call (columns in the README). otel-json: OTLP/JSON NDJSON, one "
                   "ExportTraceServiceRequest per line (a rollout, or up to 1,000 of its spans), for a collector's /v1/traces.")
@click.option("-o", "--output", required=True, help="The file to write.")
@click.option("--rollout", "pattern", metavar="GLOB", help="Only rollouts whose id matches this glob.")
@click.option("--token-arrays", is_flag=True,
              help="Parquet: add prompt_token_ids, generation_token_ids, generation_log_probs (one row per call and choice; large).")
@click.option("--output-text", is_flag=True, help="Parquet: add output_text, the reply's answer text (large).")
@click.option("--ray", "ray_address", metavar="ADDRESS",
              help="Parquet, for a directory too big for one process: read it with records.ray_dataset on this Ray "
                   "cluster ('auto', 'ray://head:10001', or 'local' to start one here) and write -o as a directory "
                   "of Parquet files (rows as ray_dataset's; needs the ray extra).")
def export_command(directory: str, kind: str, output: str, pattern: Optional[str], token_arrays: bool,
                   output_text: bool, ray_address: Optional[str]) -> None:
    """Export one row per call as Parquet, or OpenTelemetry GenAI spans as OTLP/JSON lines.

    This reads in one process. For a whole training run (millions of calls, many sidecars) use
    --ray, or records.ray_dataset in your own Ray job (README, "A whole run on Ray Data").
    """
    from records import iter_token_records

    from .export import otel_lines, with_token_arrays, write_parquet
    from .tables import iter_call_rows

    if (token_arrays or output_text) and kind != "parquet":
        raise click.UsageError("--token-arrays and --output-text go with --format parquet")
    if ray_address is not None:
        if kind != "parquet" or output_text or pattern:
            raise click.UsageError("--ray writes Parquet, without --output-text or --rollout")
        _writable_parent(output)
        _store(directory)
        count = _export_on_ray(directory, output, ray_address, "tokens" if token_arrays else "calls")
        click.echo(f"wrote {output}/: {count:,} rows")
        return
    _writable_parent(output)
    store = _store(directory)
    rollout_ids = _rollouts_or_say_empty(store, pattern)
    if kind == "otel-json":
        count = 0
        with open(output, "wb") as handle, progress(len(rollout_ids), "exporting") as bar:
            for rid in rollout_ids:
                rows = list(iter_call_rows(store, rid))
                handle.writelines(otel_lines([(rid, rows)]))
                count += len(rows)
                bar.update(1)
        click.echo(f"wrote {output}: {count:,} calls in {len(rollout_ids):,} traces")
        return
    rows = []
    with progress(len(rollout_ids), "reading") as bar:
        for rid in rollout_ids:
            rows.extend(iter_call_rows(store, rid, output_text=output_text))
            bar.update(1)
    try:
        if token_arrays:
            tokens = (record for rid in rollout_ids for record in iter_token_records(store, rid))
            count = write_parquet(list(with_token_arrays(rows, tokens)), output, token_arrays=True, output_text=output_text)
        else:
            count = write_parquet(rows, output, output_text=output_text)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {output}: {count:,} rows")


def _export_on_ray(directory: str, output: str, address: str, kind: str) -> int:
    """`records.ray_dataset` written as a directory of Parquet files; the rows written."""
    try:
        import pyarrow.parquet as pq
        import ray
    except ImportError:
        raise click.ClickException("--ray needs Ray Data: pip install 'ray[data]' (the ray extra)") from None
    from records import ray_dataset

    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address, log_to_driver=False)
    ray_dataset(directory, kind=kind).write_parquet(output)
    return sum(pq.ParquetFile(os.path.join(output, name)).metadata.num_rows
               for name in os.listdir(output) if name.endswith(".parquet"))
