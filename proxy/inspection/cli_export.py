"""`mcc report` and `mcc export`."""

from __future__ import annotations

import os
from typing import Optional

import click
import orjson

from .cli import _rollouts_or_say_empty, _store, progress
from .tables import iter_call_rows


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


class OneSentence(click.ClickException):
    """A usage problem said in one line (``Error: ...``), exit status 2."""

    exit_code = 2


def _writable_parent(output: str) -> None:
    """One sentence (exit 2) when ``output`` cannot be written, before any work is done."""
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent):
        raise OneSentence(f"cannot write {output}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise OneSentence(f"cannot write {output}: the directory {parent} is not writable")


@click.command("export")
@click.argument("directory", metavar="DIR")
@click.option("--format", "kind", type=click.Choice(["parquet", "otel-json"]), required=True)
@click.option("-o", "--output", required=True, help="The file to write.")
@click.option("--rollout", "pattern", metavar="GLOB", help="Only rollouts whose id matches this glob.")
@click.option("--token-arrays", is_flag=True,
              help="Parquet: add prompt_token_ids, generation_token_ids, generation_log_probs (one row per call and choice; large).")
def export_command(directory: str, kind: str, output: str, pattern: Optional[str], token_arrays: bool) -> None:
    """Export one row per call as Parquet, or OpenTelemetry GenAI spans as OTLP JSON."""
    from records import iter_token_records

    from .export import otel_spans, with_token_arrays, write_parquet

    if token_arrays and kind != "parquet":
        raise click.UsageError("--token-arrays goes with --format parquet")
    _writable_parent(output)
    store = _store(directory)
    rollout_ids = _rollouts_or_say_empty(store, pattern)
    rows = []
    with progress(len(rollout_ids), "reading") as bar:
        for rid in rollout_ids:
            rows.extend(iter_call_rows(store, rid))
            bar.update(1)
    if kind == "parquet":
        try:
            if token_arrays:
                tokens = (record for rid in rollout_ids for record in iter_token_records(store, rid))
                count = write_parquet(list(with_token_arrays(rows, tokens)), output, token_arrays=True)
            else:
                count = write_parquet(rows, output)
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    else:
        with open(output, "wb") as handle:
            handle.write(orjson.dumps(otel_spans(rows)))
        count = len(rows)
    click.echo(f"wrote {output}: {count} calls")
