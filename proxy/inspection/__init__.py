"""The inspection commands: `mcc ls / show / stats / tail / report / export / compact / redact /
consumers / feed` over a capture directory.

Apart from the sidecar (they never touch the proxy path): `tables` flattens capture lines into
rows and totals, `cli` and `cli_export` are the click commands, `report` the HTML page, `export`
Parquet and OpenTelemetry spans.
"""

from .cli import compact_command, ls_command, show_command, stats_command, tail_command
from .cli_consumers import consumers_command, feed_command
from .cli_export import export_command, redact_command, report_command
from .tables import CallRow, RolloutRow, call_row, directory_stats, iter_call_rows, select_rollouts

#: Every inspection command, in the order `mcc --help` lists them.
COMMANDS = (ls_command, show_command, stats_command, tail_command, report_command, export_command, compact_command,
            redact_command, consumers_command, feed_command)

__all__ = ["COMMANDS", "CallRow", "RolloutRow", "call_row", "compact_command", "consumers_command", "directory_stats",
           "export_command", "feed_command",
           "iter_call_rows",
           "ls_command", "redact_command", "report_command", "select_rollouts", "show_command", "stats_command", "tail_command"]
