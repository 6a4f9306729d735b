"""`mcc consumers` and `mcc feed`: the consumers of ended rollouts, from a shell (docs/reading.md,
"Consuming rollouts during the run")."""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import click
import orjson

from records import Consumer, FinishedGroup, FinishedRollout
from records.training import consumer_names, consumer_view
from records.contract import CAPTURE_SUFFIX
from records.contract.reading import is_store_url
from records.store import read_run_ended

from .cli import OneSentence, _print_table


def _directory(directory: str) -> str:
    if is_store_url(directory):
        return directory
    if not os.path.isdir(directory):
        raise click.BadParameter(f"{directory!r} is not a directory", param_hint="DIR")
    return directory


@click.command("consumers")
@click.argument("directory", metavar="CAPTURES")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per consumer name, then one for the run.")
@click.option("--unended-after", type=float, default=300.0, show_default=True,
              help="A rollout with calls and no end counts as unended once its last call is this many seconds old.")
def consumers_command(directory: str, as_json: bool, unended_after: float) -> None:
    """Per consumer name of CAPTURES (a capture directory or a store URL): ended rollouts
    acknowledged (final, and pending a commit), leased, waiting, dropped, stale, partial, and
    the age of the oldest waiting end; then the run: whether it ended, its unended rollouts (calls
    and no end: a crashed runner, a typo'd end) by group, and its side calls (never trained on)."""
    directory = _directory(directory)
    names = consumer_names(directory)
    rows = []
    for name in names:
        view = consumer_view(directory, name, unended_after)
        counts = view.counts()
        oldest = view.oldest_waiting()
        age = round(time.time() - oldest.ended_at, 1) if oldest is not None else None
        if as_json:
            click.echo(orjson.dumps({"consumer": name, **counts, "oldest_waiting_age_s": age}).decode())
        rows.append([name, *(str(counts[key]) for key in ("final", "pending", "leased", "waiting", "dropped", "stale",
                                                          "partial")),
                     "-" if age is None else f"{age:g}s"])
    run = _run_state(directory, unended_after)
    if as_json:
        click.echo(orjson.dumps({"run": run}).decode())
        return
    if rows:
        _print_table(["consumer", "acked", "pending commit", "leased", "waiting", "dropped", "stale", "partial",
                      "oldest waiting"], rows)
    else:
        click.echo(f"no consumer has taken anything from {directory} yet: {run['ended_rollouts']:,} ended rollout(s) "
                   f"wait" + (f", the oldest ended {run['oldest_end_age_s']:g}s ago" if run["oldest_end_age_s"] else ""))
    click.echo(f"run: {'ended' if run['run_ended_at'] else 'going on'}; {run['ended_rollouts']:,} rollout(s) ended, "
               f"{sum(len(ids) for ids in run['unended'].values()):,} unended (calls, no end, idle over "
               f"{unended_after:g}s)" + _by_group(run["unended"])
               + ("" if run["side_calls"] is None else f"; {run['side_calls']:,} side call(s) captured, never trained on"))


def _run_state(directory: str, unended_after: float) -> dict[str, Any]:
    """What the run's captures say, whatever the consumers: ends, the run's end, unended rollouts
    by group, side calls (counted in a directory's lines: a byte search; None for a store)."""
    view = consumer_view(directory, "mcc-consumers-run-view", unended_after)  # A name nobody uses: nothing held.
    counts = view.counts()
    oldest = view.oldest_waiting()
    run_end = read_run_ended(directory)
    return {"ended_rollouts": counts["waiting"], "run_ended_at": run_end["ended_at"] if run_end else None,
            "oldest_end_age_s": round(time.time() - oldest.ended_at, 1) if oldest is not None else None,
            "unended": {key or "-": ids for key, ids in view.unended().items()},
            "side_calls": None if is_store_url(directory) else _side_calls_in(directory)}


def _side_calls_in(directory: str) -> int:
    """Lines marked side calls in a capture directory (``"side_call":{`` as the sidecar writes it)."""
    found = 0
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith(CAPTURE_SUFFIX):
                with open(entry.path, "rb") as handle:
                    found += handle.read().count(b'"side_call":{')
    return found


def _by_group(unended: dict[str, list[str]]) -> str:
    if not unended:
        return ""
    shown = [f"{group}: {', '.join(ids[:5])}{' ...' if len(ids) > 5 else ''}" for group, ids in sorted(unended.items())[:5]]
    return " (" + "; ".join(shown) + (" ..." if len(unended) > 5 else "") + ")"


def _rollout_fields(item: FinishedRollout) -> dict[str, object]:
    return {"rollout_id": item.rollout_id, "ended_at": item.ended_at, "outcome": item.outcome, "group": item.group,
            "calls": len(item.calls), "incomplete": item.incomplete, "masked": item.trajectories.masked,
            "stale": item.stale}


@click.command("feed")
@click.argument("directory", metavar="CAPTURES")
@click.option("--consumer", "name", required=True, help="The consumer name to take for.")
@click.option("--max", "max_rollouts", type=int, default=None, help="Stop after this many rollouts (default: all "
              "that are waiting).")
@click.option("--wait", type=float, default=0.0, show_default=True, help="Seconds to wait for a first rollout.")
@click.option("--ack", is_flag=True, help="Acknowledge each rollout once printed (final at once); without it they "
              "stay leased until --lease-seconds runs out.")
@click.option("--lease-seconds", type=float, default=300.0, show_default=True, help="How long the rollouts are leased.")
@click.option("--group-size", type=click.IntRange(min=1), default=None,
              help="Hand out groups of this size whole, one JSON line each (the size an end declared wins).")
def feed_command(directory: str, name: str, max_rollouts: Optional[int], wait: float, ack: bool,
                 lease_seconds: float, group_size: Optional[int]) -> None:
    """Take ended rollouts of CAPTURES (a capture directory or a store URL) for a consumer name and
    print them as JSON lines (rollout_id, ended_at, outcome, group, calls, incomplete, masked,
    stale, epoch; a group: group, partial, missing, epoch and its rollouts), for shell pipelines."""
    directory = _directory(directory)
    try:
        consumer = Consumer(directory, name, lease_seconds=lease_seconds)
    except ValueError as exc:
        raise OneSentence(str(exc)) from None
    printed = 0
    while max_rollouts is None or printed < max_rollouts:
        batch = consumer.take(min(64, (max_rollouts or 64) - printed), wait=wait if printed == 0 else 0.0,
                              group_size=group_size)
        if not batch:
            break
        for item in batch:
            if isinstance(item, FinishedGroup):
                click.echo(orjson.dumps({"group": item.group, "partial": item.partial, "missing": item.missing,
                                         "epoch": item.lease.epoch,
                                         "rollouts": [_rollout_fields(rollout) for rollout in item.rollouts]}).decode())
            else:
                click.echo(orjson.dumps({**_rollout_fields(item), "epoch": item.lease.epoch}).decode())
        if ack:
            consumer.ack(batch)
        printed += len(batch)
