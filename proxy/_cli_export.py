"""`mcc report` and `mcc export`."""

from __future__ import annotations

from typing import Optional

import click
import orjson

from ._cli_inspect import _store
from ._inspect import iter_call_rows, select_rollouts


@click.command("report")
@click.argument("directory", metavar="DIR")
@click.option("-o", "--output", default="report.html", show_default=True, help="The HTML file to write.")
@click.option("--rollout", "pattern", metavar="GLOB", help="Only rollouts whose id matches this glob.")
def report_command(directory: str, output: str, pattern: Optional[str]) -> None:
    """Write one self-contained HTML report (opens from disk, no network)."""
    from ._report import build_report

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
def export_command(directory: str, kind: str, output: str, pattern: Optional[str]) -> None:
    """Export one row per call as Parquet, or OpenTelemetry GenAI spans as OTLP JSON."""
    from ._export import otel_spans, write_parquet

    store = _store(directory)
    rows = [row for rid in select_rollouts(store, pattern) for row in iter_call_rows(store, rid)]
    if kind == "parquet":
        try:
            count = write_parquet(rows, output)
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    else:
        with open(output, "wb") as handle:
            handle.write(orjson.dumps(otel_spans(rows)))
        count = len(rows)
    click.echo(f"wrote {output}: {count} calls")
