"""`mcc report` and `mcc export`."""

from __future__ import annotations

from typing import Optional

import click
import orjson

from .cli import _store
from .tables import iter_call_rows, select_rollouts


@click.command("report")
@click.argument("directory", metavar="DIR")
@click.option("-o", "--output", default="report.html", show_default=True, help="The HTML file to write.")
@click.option("--rollout", "pattern", metavar="GLOB", help="Only rollouts whose id matches this glob.")
def report_command(directory: str, output: str, pattern: Optional[str]) -> None:
    """Write one self-contained HTML report (opens from disk, no network)."""
    from .report import build_report

    store = _store(directory)
    rollout_ids = select_rollouts(store, pattern)
    with open(output, "w", encoding="utf-8") as handle:
        handle.write(build_report(store, rollout_ids))
    click.echo(f"wrote {output}: {len(rollout_ids)} rollouts")


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

    store = _store(directory)
    rollout_ids = select_rollouts(store, pattern)
    rows = [row for rid in rollout_ids for row in iter_call_rows(store, rid)]
    if token_arrays and kind != "parquet":
        raise click.UsageError("--token-arrays goes with --format parquet")
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
