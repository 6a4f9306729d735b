"""`mcc ls`, `mcc show`, `mcc stats`, `mcc tail`, `mcc report`, `mcc export`: look at captures.

These commands read capture files through `records`; they never start the proxy.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

import click
import orjson

from records.contract import CAPTURE_SUFFIX, is_valid_rollout_id
from records.contract.reading import StoreUnavailable, TOKENS_SUFFIX, is_store_url
from records import CaptureStore, StoreNotFound, TokenRecord, iter_token_records, read_model_call_records, trajectories
from records.store import SegmentDamaged, compact_store
from records.training import TokenRecordFollower

from .file_modes import made_private, permissions_option, writing_privately
from .lineage_words import lineage_words
from .tables import (
    CallRow,
    RolloutRow,
    call_row,
    directory_stats,
    pretty_json,
    read_call,
    rollout_row,
    select_rollouts,
)

from capture import ERROR_CATEGORIES

_SORT_KEYS = {"rollout": "rollout_id", "calls": "calls", "tokens": "tokens_in", "errors": "errors",
              "latency": "max_latency_ms", "first": "first_call_at", "last": "last_call_at"}
#: Sorted biggest first: a user sorting by tokens wants the heaviest rollouts on top.
_BIGGEST_FIRST = {"calls", "tokens", "errors", "latency"}


class OneSentence(click.ClickException):
    """A usage problem said in one line (``mcc: ...``), exit status 2."""

    exit_code = 2


def _rollout_id(store: CaptureStore, rollout_id: str) -> str:
    """``rollout_id`` when it is one; a glob or a path is a usage problem said in one sentence
    that names the command which finds the rollout (issue 22, point 7)."""
    if is_valid_rollout_id(rollout_id):
        return rollout_id
    directory = shlex.quote(store.capture_dir)
    if any(char in rollout_id for char in "*?["):
        raise OneSentence(f"{rollout_id!r} is a pattern, not a rollout id: "
                          f"mcc ls {directory} --rollout {shlex.quote(rollout_id)} lists the rollouts it matches")
    name = os.path.basename(rollout_id.rstrip("/"))
    if name.endswith(CAPTURE_SUFFIX) and is_valid_rollout_id(name[: -len(CAPTURE_SUFFIX)]):
        raise OneSentence(f"{rollout_id!r} is a path, not a rollout id: its rollout id is "
                          f"{name[: -len(CAPTURE_SUFFIX)]!r} (mcc ls {directory} --rollout 'GLOB' lists them)")
    raise OneSentence(f"{rollout_id!r} is not a rollout id (1-200 of A-Z a-z 0-9 . _ -, starting with a letter or "
                      f"digit): mcc ls {directory} --rollout 'GLOB' lists the rollouts")


def _store(directory: str, allow_empty: bool = False) -> CaptureStore:
    if is_store_url(directory):  # A capture store (docs/files.md): read as Gym's per-rollout files.
        try:
            return CaptureStore(directory, allow_empty=allow_empty)
        except StoreNotFound as exc:  # A URL that points nowhere is an error, as a missing directory is.
            raise OneSentence(str(exc)) from None
        except (StoreUnavailable, OSError, SegmentDamaged) as exc:
            raise click.ClickException(f"cannot read the store {directory}: {exc}") from None
    if not os.path.isdir(directory):
        raise click.BadParameter(f"{directory!r} is not a directory", param_hint="DIR")
    return CaptureStore(directory)


def _rollouts_or_say_empty(store: CaptureStore, pattern: Optional[str]) -> list[str]:
    """The selected rollouts; an empty directory is said so on stderr (a wrong mount must not look like a quiet run)."""
    rollout_ids = select_rollouts(store, pattern)
    if not rollout_ids:
        what = f"no rollout matches {pattern!r} in" if pattern and store.rollout_ids() else "no capture files in"
        click.echo(f"mcc: {what} {store.where}", err=True)
    return rollout_ids


def progress(length: int, label: str) -> Any:
    """A progress bar (``with ... as bar: bar.update(1)``) on a terminal for long jobs (over 200
    rollouts), else one that shows nothing."""
    if length > 200 and sys.stderr.isatty():
        return click.progressbar(length=length, label=label, file=sys.stderr)
    return _NoBar()


class _NoBar:
    def update(self, _: int) -> None:
        pass

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _time(value: Optional[float]) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(value)) if value is not None else "-"


def _n(value: Any) -> str:
    """A number with thousands separators; ``-`` for one nobody reported."""
    return "-" if value is None else (f"{value:,.1f}" if isinstance(value, float) else f"{value:,}")


def _cut(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` characters: both ends of a long id stay readable
    (``--json`` prints it whole)."""
    if len(text) <= width:
        return text
    keep = width - 1
    return text[: keep - keep // 2] + "…" + text[len(text) - keep // 2:]


#: Widest a table cell grows before it is cut (`_cut`).
ID_WIDTH, CELL_WIDTH = 48, 32


def _print_table(headers: list[str], rows: list[list[str]]) -> None:
    """Columns as wide as their widest cell; a shorter row (a note, such as an unreadable line)
    runs its last cell on past the columns without widening them."""
    full = [r for r in rows if len(r) == len(headers)]
    widths = [max(len(h), *(len(r[i]) for r in full)) if full else len(h) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


@click.command("ls")
@click.argument("directory", metavar="DIR")
@click.option("--rollout", "pattern", metavar="GLOB", help="Only rollouts whose id matches this glob.")
@click.option("--error", "category", type=click.Choice(["any", *sorted(ERROR_CATEGORIES)]),
              help="Only rollouts with calls of this error category ('any' for any).")
@click.option("--sort", "sort_key", type=click.Choice(list(_SORT_KEYS)), default="rollout", show_default=True,
              help="calls, tokens, errors and latency (the slowest call) put the biggest first.")
@click.option("--reverse", is_flag=True, help="Reverse the order.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per rollout.")
@click.option("--allow-empty", is_flag=True, help="Read a store URL where nothing is yet (no writer seen, nothing "
              "uploaded) as an empty run instead of failing (a collector that may start first).")
def ls_command(directory: str, pattern: Optional[str], category: Optional[str], sort_key: str, reverse: bool, as_json: bool,
               allow_empty: bool) -> None:
    """One row per rollout: calls, turns (calls but side calls and calls after its end), tokens in / out /
    cached, errors, first and last call, incomplete.

    A token count no call reported is shown as - (null with --json), never as 0.
    """
    store = _store(directory, allow_empty)
    rollout_ids = _rollouts_or_say_empty(store, pattern)
    rows = []
    with progress(len(rollout_ids), "reading") as bar:
        for rollout_id in rollout_ids:
            rows.append(rollout_row(store, rollout_id))
            bar.update(1)
    if category:
        rows = [r for r in rows if (r.errors if category == "any" else r.error_categories.get(category))]
    key = _SORT_KEYS[sort_key]
    if key == "rollout_id":
        rows.sort(key=lambda r: r.rollout_id, reverse=reverse)
    else:  # Rows without the value go last whichever way the others are ordered.
        biggest_first = (sort_key in _BIGGEST_FIRST) != reverse
        present = sorted((r for r in rows if getattr(r, key) is not None), key=lambda r: getattr(r, key), reverse=biggest_first)
        rows = present + [r for r in rows if getattr(r, key) is None]
    if as_json:
        for row in rows:
            click.echo(orjson.dumps(row.as_dict()).decode())
        return
    if not rows:
        return  # Nothing to list (said on stderr when the directory is empty): no header alone.
    _print_table(["rollout", "calls", "turns", "in", "out", "cached", "errors", "unreadable", "first call (UTC)",
                  "last call (UTC)", "incomplete"],
                 [[_cut(r.rollout_id, ID_WIDTH), _n(r.calls), _n(r.turns), _n(r.tokens_in), _n(r.tokens_out), _n(r.cached_tokens),
                   _errors(r), _n(r.unreadable_lines) if r.unreadable_lines else "", _time(r.first_call_at),
                   _time(r.last_call_at), "yes" if r.incomplete else ""] for r in rows])


def _errors(row: RolloutRow) -> str:
    """``3 (upstream_error:2, timeout:1)``: the categories by count, the most frequent first."""
    ordered = sorted(row.error_categories.items(), key=lambda kv: (-kv[1], kv[0]))
    return _n(row.errors) + (f" ({', '.join(f'{k}:{v:,}' for k, v in ordered)})" if row.errors else "")


@click.command("show")
@click.argument("directory", metavar="DIR")
@click.argument("rollout_id", metavar="ROLLOUT")
@click.option("--call", "call_index", type=int, help="Print this call's request and response.")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
@click.option("--full", is_flag=True, help="With --call: print per-token logprob entries and token id lists whole "
                                           "(by default each is summarised in one line).")
def show_command(directory: str, rollout_id: str, call_index: Optional[int], as_json: bool, full: bool) -> None:
    """The calls of one rollout in order, or one call in full with --call N."""
    store = _store(directory)
    rollout_id = _rollout_id(store, rollout_id)
    if not os.path.exists(store.path_for(rollout_id)):
        if store.is_incomplete(rollout_id):
            raise click.ClickException(f"rollout {rollout_id!r} has no lines, only its .capture.incomplete marker: "
                                       "every line of it was lost (see the sidecar's log)")
        raise click.ClickException(f"no capture file for rollout {rollout_id!r} in {directory}")
    if call_index is not None:
        try:
            line = read_call(store, rollout_id, call_index)
        except KeyError as exc:
            raise click.ClickException(str(exc.args[0])) from None
        if line is None:
            raise click.ClickException(f"call {call_index} of {rollout_id} is an unreadable line (not one JSON object: "
                                       "torn by a crash, or damaged); the capture file keeps its bytes")
        if as_json:
            click.echo(orjson.dumps(line).decode())
            return
        row = call_row(rollout_id, call_index, line)
        click.echo(f"call {call_index} of {rollout_id}: {row.dialect} {row.model or ''} status {row.status_code} "
                   f"{row.error_category or 'ok'}, latency {_n(row.latency_ms)} ms, "
                   + (f"ttft {_n(row.ttft_ms)} ms" if row.ttft_ms is not None else "no first token"))
        if row.system_fingerprint is not None:
            click.echo(f"served by {row.engine or 'an engine'} {row.engine_version or ''} (system_fingerprint "
                       f"{row.system_fingerprint})".replace("  ", " "))
        if row.multimodal_tokens is not None:
            by_modality = orjson.loads(row.multimodal_tokens_by_modality) if row.multimodal_tokens_by_modality else {}
            click.echo(f"multimodal prompt tokens {row.multimodal_tokens:,}"
                       + (" (" + ", ".join(f"{k} {v:,}" for k, v in by_modality.items()) + ")" if by_modality else ""))
        if row.engine_metrics is not None:
            click.echo("engine metrics " + ", ".join(f"{k} {v}" for k, v in orjson.loads(row.engine_metrics).items()))
        for said in privacy_lines(store, rollout_id, call_index):
            click.echo(said)
        if row.request_body_refused:
            click.echo("\n--- request ---\n(the body was over --max-body-bytes: it was refused unread, and not kept)")
        for title, key in (("request", "request"), ("request (raw)", "request_raw"), ("response", "response"),
                           ("failure", "failure")):
            if line.get(key) is not None:
                click.echo(f"\n--- {title} ---")
                value = line[key] if full or key != "response" else summarised_arrays(line[key])
                click.echo(value if isinstance(value, str) else pretty_json(value))
        if line.get("response") is None and line.get("response_raw"):
            click.echo("\n--- response (raw) ---")
            click.echo(line["response_raw"])
        for said in training_summary(store, rollout_id, call_index):
            click.echo(said)
        return
    # An unreadable line keeps its place (its index is its position in the file: docs/files.md).
    rows = [call_row(rollout_id, index, line) if line is not None else index
            for index, line in store.iter_available(rollout_id)]
    if as_json:
        verdicts = {record.call_index: record for record in iter_token_records(store, rollout_id)
                    if record.choice_index == 0 and (record.prompt_token_ids is not None or record.generation_token_ids is not None)}
        for shown in rows:
            if not isinstance(shown, CallRow):
                click.echo(orjson.dumps({"rollout_id": rollout_id, "call_index": shown, "unreadable": True}).decode())
                continue
            values = shown.as_dict()
            record = verdicts.get(shown.call_index)
            values.update(usable=record.usable if record else None, extends=record.extends if record else None,
                          drift_at=record.drift_at if record else None, drift_from=record.drift_from if record else None,
                          link=record.link if record else None, link_reason=record.link_reason if record else None,
                          prefix_supplied=record.prefix_supplied if record else None,
                          resumes=record.resumes if record else None,
                          weight_versions=record.weight_versions if record else None,
                          weight_version_source=record.weight_version_source if record else None)
            click.echo(orjson.dumps(values).decode())
        return
    training = _training_cells(store, rollout_id)
    _print_table(["#", "dialect", "model", "status", "ttft_ms", "latency_ms", "in", "out", "cached", "finish", "response status",
                  "tool calls", "error", "training arrays"],
                 [[*_call_cells(r), training.get(r.call_index, "-")] if isinstance(r, CallRow) else
                  [str(r), _UNREADABLE] for r in rows])
    for said in [*agent_lines(rows), *chain_lines(store.capture_dir, rollout_id, rows), *_missing_count_lines(store, rollout_id, rows),
                 *privacy_lines(store, rollout_id)]:
        click.echo(said)


def privacy_lines(store: CaptureStore, rollout_id: str, call_index: Optional[int] = None) -> list[str]:
    """What redaction did to the rollout's lines (docs/privacy.md), or to one call's: the values
    each rule replaced, the calls written metrics-only because redaction failed, and the lines
    kept metrics-only by ``--privacy``; nothing when none was redacted."""
    replaced: dict[str, int] = {}
    failed: list[int] = []
    bare = 0
    for index, line in store.iter_available(rollout_id):
        if line is None or (call_index is not None and index != call_index):
            continue
        for rule, count in (line.get("redactions") or {}).items():
            if type(count) is int:
                replaced[rule] = replaced.get(rule, 0) + count
        if line.get("redaction_failed") is True:
            failed.append(index)
        elif line.get("privacy") == "metrics-only":
            bare += 1
    said = []
    if replaced:
        said.append("redacted: " + ", ".join(f"{rule} {count:,}" for rule, count in sorted(replaced.items()))
                    + " value(s) replaced")
    if failed:
        said.append(f"redaction failed for call(s) {', '.join(map(str, failed[:20]))}: written without content "
                    "(metrics-only), see mcc_redaction_failures_total")
    if bare:
        said.append(f"privacy metrics-only: {bare:,} line(s) keep no content")
    return said


def _missing_count_lines(store: CaptureStore, rollout_id: str, rows: list[Any]) -> list[str]:
    """Why an in / out count is "-": the reply reported no usage; and the counts the token mode's
    arrays give instead, when it captured them (``token_counts: counted`` on the record)."""
    missing = [row.call_index for row in rows if isinstance(row, CallRow) and (row.tokens_in is None or row.tokens_out is None)
               and row.status_code == 200]
    if not missing:
        return []
    counted = {record.call_index: record for record in read_model_call_records(store, rollout_id)
               if record.token_counts == "counted"}
    lines = [f"in/out -: call(s) {', '.join(map(str, missing[:20]))} reported no usage (a stream without "
             "stream_options.include_usage; vLLM's --enable-force-include-usage, or the stand-in's "
             "--force-include-usage, adds it to every stream)"]
    if counted:
        lines.append("  counted from the token mode's arrays instead: " + ", ".join(
            f"call {index} in {counted[index].tokens_in} out {counted[index].tokens_out}" for index in missing if index in counted))
    else:
        lines.append("  and no token arrays were captured to count them from (--capture-tokens records them)")
    return lines


def agent_lines(rows: list[Any]) -> list[str]:
    """The rollout's calls grouped by the harness's agent (``client_agent_id``; a subagent names its
    parent), in order of first call; nothing when no call names an agent."""
    calls = [row for row in rows if isinstance(row, CallRow)]
    if not any(row.client_agent_id or row.client_parent_agent_id for row in calls):
        return []
    groups: dict[Optional[str], list[CallRow]] = {}
    for row in calls:
        groups.setdefault(row.client_agent_id, []).append(row)
    said = [f"{len(groups)} agent{'s' if len(groups) != 1 else ''} (the harness's agent headers):"]
    for agent, members in groups.items():
        parents = sorted({row.client_parent_agent_id for row in members if row.client_parent_agent_id})
        name = f"agent {agent}" if agent is not None else "no agent id (the main agent)"
        if parents:
            name += f", started by {', '.join(parents)}"
        said.append(f"  {name}: {len(members)} call{'s' if len(members) != 1 else ''} "
                    + " ".join(f"#{row.call_index}" for row in members))
    return said


def chain_lines(directory: str, rollout_id: str, rows: list[Any]) -> list[str]:
    """The rollout's trajectories (`records.trajectories`) in a few lines: each chain's calls by
    ``#index``, its size, and whether a trainer may take it (issue 31); nothing without a token file."""
    if not os.path.exists(os.path.join(directory, rollout_id + TOKENS_SUFFIX)):
        return []
    build = trajectories(directory, rollout_id)
    index_of = {row.model_call_id: row.call_index for row in rows if isinstance(row, CallRow)}

    def name(call_id: str) -> str:
        base, _, choice = call_id.rpartition("-") if call_id not in index_of else (call_id, "", "")
        return f"#{index_of[call_id]}" if call_id in index_of else f"#{index_of.get(base, '?')}.{choice}"

    said = ["", "trajectory: " + _verdict(build)]
    for chain in build.chains:
        said.append(f"  {chain.chain_id}: {' -> '.join(name(call.model_call_id) for call in chain.calls)}; "
                    f"{len(chain.token_ids):,} ids, {sum(chain.loss_mask):,} trained"
                    + (f"; weights {', '.join(chain.weight_version_labels)}" if chain.weight_version_labels else ""))
    return said


def _verdict(build: Any) -> str:
    """Trainable, masked and why -- or, for calls none of which continues another (an eval's
    samples, a completions rollout), "independent": the records keep NeMo Gym's verdict (one
    trajectory per rollout, so such a rollout is masked), but to an eval user "masked" reads as
    an alarm about their calls, which are whole."""
    if not build.masked:
        return "trainable"
    notes = build.notes
    calls = notes.get("n_calls", 0)
    if calls > 1 and notes.get("roots") == notes.get("chains") == calls and str(build.mask_reason).endswith("not one"):
        return (f"{calls} independent calls (none continues another, as an eval's samples; "
                f"as one RL trajectory it is masked: {build.mask_reason})")
    return f"masked ({build.mask_reason})"


#: Per-token lists a reply may carry: printed as one line each unless ``--full``.
_PER_TOKEN_KEYS = frozenset({"content", "refusal", "token_ids", "prompt_token_ids", "logprobs", "tokens", "top_logprobs",
                             "token_logprobs", "text_offset"})


def summarised_arrays(value: Any, key: str = "") -> Any:
    """``value`` with every per-token list (logprob entries, id lists) of more than a few items
    said in one line: a 15-token reply's logprobs are 15 objects of 5 lines each otherwise."""
    if isinstance(value, dict):
        return {name: summarised_arrays(item, name) for name, item in value.items()}
    if isinstance(value, list):
        if key in _PER_TOKEN_KEYS and len(value) > 3 and (all(isinstance(v, int) for v in value) or all(
                isinstance(v, dict) and ("logprob" in v or "token" in v) for v in value)):
            kind = "ids" if isinstance(value[0], int) else "logprob entries"
            return f"({len(value):,} {kind}; --full prints them)"
        return [summarised_arrays(item, key) for item in value]
    return value


def training_summary(store: CaptureStore, rollout_id: str, call_index: int) -> list[str]:
    """`show --call`: the call's training arrays in a few lines -- sizes, usable or why not, what the
    sidecar added to its request, and drift: from which call, at which token, and what to do."""
    records = [record for record in iter_token_records(store, rollout_id) if record.call_index == call_index]
    line = read_call(store, rollout_id, call_index) or {}
    said = []
    if line.get("added_request_fields"):
        said.append("added to the request by the sidecar (cut from the agent's reply): "
                    + ", ".join(f"{name}={orjson.dumps(value).decode()}" for name, value in line["added_request_fields"].items()))
    for record in records:
        if record.prompt_token_ids is None and record.generation_token_ids is None:
            continue
        sizes = ", ".join(f"{name} {len(values):,}" for name, values in (
            ("prompt ids", record.prompt_token_ids), ("generated ids", record.generation_token_ids),
            ("logprobs", record.generation_log_probs)) if values is not None)
        reason = record.unusable_reason
        said.append(f"choice {record.choice_index}: {sizes} (source {record.source}); "
                    + ("usable" if reason is None else f"not usable: {reason}"))
        if record.extends is not None:
            said.append(f"  extends call #{record.extends}: its prompt begins with that call's prompt + generation ids")
        elif record.drift_at is not None:
            said.append(f"  drifts from call #{record.drift_from} at token {record.drift_at:,}: its prompt does not begin "
                        "with that call's prompt + generation ids. A trainer should mask it (usable and drift_at is None "
                        "keeps the clean ones), or fix the chat template so a sent-back turn renders as its generated "
                        "ids, or send prompts as token ids")
        if record.retry_of is not None:
            said.append(f"  repeats call {record.retry_of} (a retry: the same request, as bytes or as JSON)")
        said += ["  " + words for words in lineage_words(record)]
    return ["", "--- training arrays ---", *said] if said else []



def _training_cells(store: CaptureStore, rollout_id: str) -> dict[int, str]:
    """Per call with token ids: ``usable`` or why not, then ``extends #k`` / ``drifts at N`` (issue 20)."""
    cells: dict[int, str] = {}
    for record in iter_token_records(store, rollout_id):
        cell = training_cell(record) if record.choice_index == 0 else None
        if cell is not None:
            cells[record.call_index] = cell
    return cells


def training_cell(record: TokenRecord) -> Optional[str]:
    """``usable`` or why not, then ``extends #k`` / ``drifts at N``; None for a call without token ids."""
    if record.prompt_token_ids is None and record.generation_token_ids is None:
        return None
    reason = record.unusable_reason
    cell = "usable" if reason is None else "not usable: " + reason.split(":")[0]
    if record.extends is not None:
        cell += f", extends #{record.extends}"
    elif record.drift_at is not None:
        cell += f", drifts at {record.drift_at} from #{record.drift_from}"
    if record.link in ("unlinked", "left_out"):
        cell += f", {record.link.replace('_', ' ')} ({record.link_reason})"
    if record.prefix_supplied is not None:
        cell += ", prefix supplied" if record.prefix_supplied else ", prefix unproved"
    if record.weight_version_labels:
        cell += ", weights " + "→".join(record.weight_version_labels)
    return cell


_UNREADABLE = "(unreadable line: not one JSON object; the capture file keeps its bytes)"


def _call_cells(row: CallRow) -> list[str]:
    return [str(row.call_index), row.dialect or "-", _cut(row.model or "-", CELL_WIDTH), str(row.status_code or "-"),
            _n(row.ttft_ms), _n(row.latency_ms), _n(row.tokens_in), _n(row.tokens_out), _n(row.cached_tokens),
            row.finish_reason or "-", row.response_status or "-", _cut(",".join(row.tool_calls) or "-", CELL_WIDTH),
            row.error_category or "-"]


@click.command("stats")
@click.argument("directory", metavar="DIR")
@click.option("--rollout", "pattern", metavar="GLOB", help="Only rollouts whose id matches this glob.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.option("--allow-empty", is_flag=True, help="Read a store URL where nothing is yet (no writer seen, nothing "
              "uploaded) as an empty run instead of failing (a collector that may start first).")
def stats_command(directory: str, pattern: Optional[str], as_json: bool, allow_empty: bool) -> None:
    """Totals across rollouts: tokens, latency and TTFT percentiles, errors, finish reasons, cache, tools."""
    store = _store(directory, allow_empty)
    rollout_ids = _rollouts_or_say_empty(store, pattern)
    started = time.perf_counter()
    with progress(len(rollout_ids) if not as_json else 0, "scanning") as bar:  # Quiet unless stderr is a terminal.
        stats = directory_stats(store, rollout_ids, bar)
    elapsed = time.perf_counter() - started
    if as_json:
        click.echo(orjson.dumps({**stats.as_dict(), "scan_seconds": round(elapsed, 3)}).decode())
        return
    length = stats.finish_reasons.get("length", 0)
    lines = [
        f"rollouts            {stats.rollouts:,} ({stats.incomplete_rollouts:,} incomplete, {stats.unreadable_lines:,} unreadable lines)",
        f"calls               {stats.calls:,}  ({stats.calls / elapsed:,.0f} lines/s scanned)" if elapsed > 0 else "",
        f"tokens              in {_n(stats.tokens_in)}, out {_n(stats.tokens_out)}, cached {_n(stats.cached_tokens)}, "
        f"reasoning {_n(stats.tokens_reasoning)} (over the {stats.calls_with_usage:,} calls that reported usage; "
        f"{stats.calls - stats.calls_with_usage:,} did not)",
        "latency ms          " + _pcts(stats.latency_ms),
        "ttft ms             " + (_pcts(stats.ttft_ms) if stats.ttft_ms.get("p50") is not None else "no call had a first token"),
        "errors              " + (", ".join(f"{k} {v:,}" for k, v in stats.error_categories.items()) or "none"),
        "finish reasons      " + (", ".join(f"{k} {v:,}" for k, v in stats.finish_reasons.items()) or "-"),
        "response statuses   " + (", ".join(f"{k} {v:,}" for k, v in stats.response_statuses.items()) or "-"),
        f"cut by length       {length:,} of {stats.calls:,} calls" + (f" ({length / stats.calls:.1%})" if stats.calls else ""),
        "cache hit ratio     " + (f"{stats.cache_hit_ratio:.1%} of the {_calls(stats.calls_with_cache_counts)} that reported cache "
                                   f"counts ({_calls(stats.calls - stats.calls_with_cache_counts)} did not)"
                                   + (f", {stats.cached_token_ratio:.1%} of their prompt tokens" if stats.cached_token_ratio is not None else "")
                                   if stats.cache_hit_ratio is not None else "not reported by any call"),
        f"tool calls          {stats.tool_calls:,} ({stats.tool_calls_with_invalid_arguments:,} with arguments that are not valid JSON)",
        "turns per rollout   " + _pcts({k: None if v is None else round(v) for k, v in stats.turns_per_rollout.items()}),
        _not_turns(stats),
        (f"training arrays     {stats.usable_generations:,} of {stats.generations_with_token_ids:,} generations with token "
         f"ids usable" + (" (not: " + ", ".join(f"{k} {v:,}" for k, v in stats.unusable_reasons.items()) + ")"
                           if stats.unusable_reasons else "")
         + f"; prompts extending an earlier call {stats.prompts_extending_an_earlier_call:,}, "
           f"drifting from one {stats.prompts_drifting:,}") if stats.generations_with_token_ids else "",
        ("trajectory builder  " + ", ".join(f"{link.replace('_', ' ')} {count:,}" for link, count in sorted(stats.calls_by_link.items()))
         + (" (an unlinked call masks its rollout)" if stats.calls_by_link.get("unlinked") else ""))
        if stats.calls_by_link else "",
        (f"prefix supply       {stats.prompts_supplied:,} prompts sent on their parent's exact ids and proved"
         f" ({stats.prompts_supplied_unproved:,} sent, not proved)")
        if stats.prompts_supplied or stats.prompts_supplied_unproved else "",
        f"aborted, resumed    {stats.resumed_calls:,} calls resumed an aborted one" if stats.resumed_calls else "",
        ("weight versions     " + ", ".join(f"{k} {v:,}" for k, v in stats.generations_by_weight_version.items())
         + f" generations; {stats.generations_spanning_an_update:,} spanning an update")
        if stats.generations_by_weight_version else "",
        ("engines             " + ", ".join(f"{k} {v:,}" for k, v in stats.calls_by_engine_fingerprint.items()) + " calls"
         + (f"; {len(stats.rollouts_with_several_engines):,} rollout(s) served by more than one engine fingerprint "
            f"(an engine changed mid-rollout: its prompts may render differently): "
            + ", ".join(stats.rollouts_with_several_engines[:5]) if stats.rollouts_with_several_engines else ""))
        if stats.calls_by_engine_fingerprint else "",
        ("multimodal tokens   " + ", ".join(f"{k} {v:,}" for k, v in sorted(stats.multimodal_tokens_by_modality.items()))
         + " prompt tokens") if stats.multimodal_tokens_by_modality else "",
        (f"engine metrics      {stats.calls_with_engine_metrics:,} calls; mean "
         + ", ".join(f"{k} {v / stats.calls_with_engine_metrics:.4g}" for k, v in stats.engine_metric_sums.items()))
        if stats.calls_with_engine_metrics else "",
    ]
    click.echo("\n".join(line for line in lines if line))


def _not_turns(stats: Any) -> str:
    """The calls captured that are not turns (side calls, calls after their rollout's end), or ""."""
    parts = []
    if stats.side_calls:
        reasons = ", ".join(f"{reason} {count:,}" for reason, count in sorted(stats.side_calls.items()))
        parts.append(f"side calls {sum(stats.side_calls.values()):,} ({reasons})")
    if stats.calls_after_end:
        parts.append(f"calls after their rollout's end {stats.calls_after_end:,}")
    return ("not turns           " + ", ".join(parts) + " (captured, never trained on)") if parts else ""


def _calls(count: int) -> str:
    return f"{count:,} call" if count == 1 else f"{count:,} calls"


def _pcts(values: dict[str, Optional[float]]) -> str:
    return ", ".join(f"{k} {_n(v)}" for k, v in values.items())


#: `mcc tail`'s columns and their widths: it prints as calls come, so the widths are fixed (a
#: longer cell is cut in the middle); the last column, the training arrays, runs on.
_TAIL_COLUMNS = (("rollout", 24), ("#call", 5), ("dialect", 11), ("model", 20), ("status", 6), ("ttft_ms", 8),
                 ("latency_ms", 10), ("in", 7), ("out", 7), ("cached", 7), ("finish", 10), ("response_status", 15),
                 ("tool_calls", 20), ("error", 18), ("training arrays", 0))
_TAIL_HEADER = "  ".join(name.ljust(width) for name, width in _TAIL_COLUMNS).rstrip()


def _tail_row(cells: list[str]) -> str:
    return "  ".join(_cut(cell, width).ljust(width) if width else cell
                     for cell, (_, width) in zip(cells, _TAIL_COLUMNS)).rstrip()


@dataclass
class _Followed:
    """Where `mcc tail` is in one rollout's file, and its training arrays' lineage so far."""

    consumed: int
    index: int
    tokens: TokenRecordFollower


@click.command("compact")
@click.argument("store_url", metavar="STORE")
@click.argument("directory", metavar="DIR")
@click.option("--rollout", "rollout_ids", multiple=True, metavar="ID", help="Only this rollout (repeatable).")
@permissions_option
def compact_command(store_url: str, directory: str, rollout_ids: tuple[str, ...], permissions: str) -> None:
    """Write Gym's per-rollout files of a capture store (segments:///path, s3://, gs://, az://) into DIR.

    Each <rollout_id>.capture.jsonl is written whole, then renamed: NeMo Gym's CaptureStore and
    read_model_call_records read DIR as they read a shared volume. Run it again as the store grows:
    the rollouts with new lines are rewritten."""
    if not is_store_url(store_url):
        raise click.BadParameter(f"{store_url!r} is not a store URL (segments:///path, s3://bucket/prefix, "
                                 "gs://bucket/prefix, az://container/prefix)", param_hint="STORE")
    for rollout_id in rollout_ids:
        if not is_valid_rollout_id(rollout_id):
            raise click.BadParameter(f"{rollout_id!r} is not a rollout id", param_hint="--rollout")
    writing_privately(permissions)  # Gym's view holds the captures' text: as private as they are.
    try:
        compact_store(store_url, os.path.abspath(directory), list(rollout_ids) or None)
    except (StoreUnavailable, OSError, SegmentDamaged) as exc:
        raise click.ClickException(f"cannot compact {store_url}: {exc}") from None
    written = sorted(name for name in os.listdir(directory) if name.endswith(CAPTURE_SUFFIX))
    made_private(permissions, *(os.path.join(directory, name) for name in written))
    click.echo(f"{len(written)} rollout file{'s' if len(written) != 1 else ''} in {directory}")


@click.command("tail")
@click.argument("directory", metavar="DIR")
@click.argument("rollout_id", metavar="[ROLLOUT]", required=False)
@click.option("--interval", type=float, default=0.5, show_default=True, help="Seconds between looks at the files.")
@click.option("--from-start", is_flag=True, help="Print the calls already there first.")
def tail_command(directory: str, rollout_id: Optional[str], interval: float, from_start: bool) -> None:
    """Follow new calls as the sidecar writes them (all rollouts, or one). Ctrl-C stops."""
    store = _store(directory)
    if rollout_id is not None:
        rollout_id = _rollout_id(store, rollout_id)
    offsets: dict[str, _Followed] = {}
    # Without --from-start the first look, which skips what is already there, happens before the
    # header is printed, so every line that lands after the header is shown. Looking after
    # printing would skip, unseen, a line written in between (issue 21, point 1).
    if from_start:
        click.echo(_TAIL_HEADER)
    for rid in [rollout_id] if rollout_id else store.rollout_ids():
        _tail_one(store, rid, offsets, emit=from_start)
    if not from_start:
        click.echo(_TAIL_HEADER)
    if rollout_id and rollout_id not in offsets:
        click.echo(f"mcc: rollout {rollout_id!r} has no capture file in {directory} yet; waiting for its first call", err=True)
    sys.stdout.flush()
    try:
        while True:
            time.sleep(interval)
            if is_store_url(directory):  # A store's view is rebuilt for what its new segments add.
                store = _store(directory)
            for rid in [rollout_id] if rollout_id else store.rollout_ids():
                _tail_one(store, rid, offsets, emit=True)
    except KeyboardInterrupt:
        pass


def _tail_one(store: CaptureStore, rollout_id: str, followed: dict[str, _Followed], emit: bool) -> None:
    path = store.path_for(rollout_id)
    state = followed.get(rollout_id) or _Followed(0, 0, TokenRecordFollower(store.capture_dir, rollout_id))
    try:
        with open(path, "rb") as handle:
            handle.seek(state.consumed)
            data = handle.read()
    except FileNotFoundError:
        return
    complete = data[: data.rfind(b"\n") + 1]  # A line still being written waits for the next look.
    for raw in complete.splitlines():
        if not raw.strip():
            continue
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            line = None
        # Every line goes through the lineage, shown or not: a later call extends an earlier one.
        records = state.tokens.records_of(state.index, line) if isinstance(line, dict) else []
        if emit:
            if isinstance(line, dict):
                row = call_row(rollout_id, state.index, line)
                first = next((r for r in records if r.choice_index == 0), None)
                cell = training_cell(first) if first is not None else None
                click.echo(_tail_row([rollout_id, f"#{state.index}", *_call_cells(row)[1:], cell or "-"]))
            else:
                click.echo(_tail_row([rollout_id, f"#{state.index}"]) + "  " + _UNREADABLE)
            sys.stdout.flush()
        state.index += 1
    state.consumed += len(complete)
    followed[rollout_id] = state
