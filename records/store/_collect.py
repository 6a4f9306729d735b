"""Reading records back, and attaching them to rollout records (docs/records.md, docs/reading.md; the seed's collector)."""

from __future__ import annotations

import logging
import os
from typing import Any, Iterable, Mapping, Optional, Sequence

from ._record import (EXTENDED_CALL_FIELDS, RAW_PAYLOAD_FIELDS, aggregate_model_call_records, build_model_call_record,
                      fill_counts_from_entries)
from ._models import ModelCallRecord
from ..contract.reading import rollout_id_from_run
from ._paths import Where
from ._store import CaptureStore, capture_store, gc_paused

#: The key `attach_model_call_capture` adds to a rollout record.
ATTACHMENT_KEY = "ng_model_call_capture"
#: The gaps an attachment may list, in NeMo Gym's form (``{"code": ...[, "detail": ...]}``).
GAP_NO_RECORDS = "model_call_capture_no_records"
GAP_RECORDS_UNREADABLE = "model_call_capture_records_unreadable"
GAP_INCOMPLETE = "model_call_capture_incomplete"
GAP_UNREADABLE = "model_call_capture_unreadable"

log = logging.getLogger(__name__)


def read_model_call_records(store: Where, rollout_id: str, *, strict: bool = False) -> list[ModelCallRecord]:
    """The rollout's calls as records, in append order (``store``: a `CaptureStore` or a directory path).

    Tolerant by default: a torn or malformed line is skipped (``store.read_available`` reports
    it); ``strict=True`` raises on one instead.
    """
    store = capture_store(store, "read_model_call_records")
    if strict:
        with gc_paused():  # One pause around parsing and building: see `gc_paused`.
            lines = store.read(rollout_id)
            records = [build_model_call_record(line, index) for index, line in enumerate(lines)]
    else:
        records, _ = _read_tolerantly(store, rollout_id)
    _count_where_usage_is_missing(store, rollout_id, records)
    return records


def _count_where_usage_is_missing(store: CaptureStore, rollout_id: str, records: list[ModelCallRecord]) -> None:
    """A call without usage (a stream that did not ask for it) whose token mode entry is there:
    its counts from the entry, marked ``counted`` (docs/records.md)."""
    if all(record.tokens_in is not None and record.tokens_out is not None for record in records):
        return
    from ._token_file_readers import counts_from_entries

    fill_counts_from_entries(records, counts_from_entries(store.capture_dir, rollout_id))


def _read_tolerantly(store: CaptureStore, rollout_id: str) -> tuple[list[ModelCallRecord], int]:
    """The records of every intact line, and how many lines were not readable.

    Each line becomes its record as soon as it is parsed (`CaptureStore.iter_available`), so
    the parsed line is still in the CPU cache when the record is derived from it.
    """
    records: list[ModelCallRecord] = []
    unreadable = 0
    append = records.append
    with gc_paused():
        for index, line in store.iter_available(rollout_id):
            if line is None:
                unreadable += 1
            else:
                append(build_model_call_record(line, index))
    return records, unreadable


def aggregate_model_call_metrics(store: Where, rollout_id: str, percentiles: Iterable[float] = (), *,
                                 extended: bool = False) -> dict[str, Any]:
    """Totals over the rollout's calls: Gym's keys, more when asked (see `aggregate_model_call_records`)."""
    store = capture_store(store, "aggregate_model_call_metrics")
    return aggregate_model_call_records(read_model_call_records(store, rollout_id), percentiles, extended=extended)


def clear_model_call_captures(rollout_ids: Iterable[str], capture_dir: Where) -> None:
    """Before dispatch: remove the capture file and incomplete marker of exactly these ids,
    so a redispatched (or kill-shaped) attempt never mixes with an earlier one.

    ``rollout_ids`` is a collection of ids; one id given as a bare string is refused
    (`TypeError`) rather than read as its characters.
    """
    if isinstance(rollout_ids, (str, bytes)):
        raise TypeError(f"rollout_ids must be a collection of rollout ids, not one string: "
                        f"clear_model_call_captures([{rollout_ids!r}], capture_dir)")
    capture_store(capture_dir, "clear_model_call_captures").clear(rollout_ids)


def attach_model_call_capture(rollout_record: Mapping[str, Any], capture_dir: Where,
                              rollout_id: Optional[str] = None, *, extended: bool = False) -> dict[str, Any]:
    """A copy of ``rollout_record`` with ``ng_model_call_capture = {rollout_id, metrics, calls[, gaps]}``.

    Every other key is left exactly as it was. The rollout id is taken from the record unless
    given: ``_ng_rollout_id``, else ``_ng_task_index`` + ``_ng_rollout_index`` (and
    ``_ng_attempt_index``); a record with neither gets ``rollout_id: null`` and a no-records gap. Attached calls omit ``request``, ``response``, ``request_raw``
    and ``response_raw``; those stay in the capture files. ``gaps`` lists what is missing, in
    NeMo Gym's form: ``{"code": "model_call_capture_no_records"}``,
    ``{"code": "model_call_capture_records_unreadable", "detail": "count=N"}``,
    ``{"code": "model_call_capture_incomplete"}``.

    The attachment has NeMo Gym 0.7.0's shape exactly; ``extended=True`` adds, in the same places,
    what Gym's has not (the calls' ``stream_truncated``, ``failure_report``, ``model_operations``,
    ``client_assistant_message_id``; the extended metrics).
    """
    store = capture_store(capture_dir, "attach_model_call_capture")
    if rollout_id is None:
        rollout_id = rollout_id_from_run(rollout_record, observability_enabled=True)
    attached = dict(rollout_record)
    if rollout_id is None:
        attached[ATTACHMENT_KEY] = {"rollout_id": None, "metrics": aggregate_model_call_records([], extended=extended), "calls": [],
                                    "gaps": [{"code": GAP_NO_RECORDS}]}
        return attached
    attached[ATTACHMENT_KEY] = _attachment(store, rollout_id, False, extended)
    return attached


def merge_model_call_capture_into_record(record: dict[str, Any], capture_dirs: Sequence[Where],
                                         include_payloads: bool = False, *, extended: bool = False) -> dict[str, Any]:
    """NeMo Gym's entry point, with its signature and its attachment's shape: attach in place and
    return ``record`` (``extended=True``: as `attach_model_call_capture`'s).

    The rollout's captures are looked for in each of ``capture_dirs`` in turn (the first that
    holds its file or its incomplete marker); no directories, or a record without a rollout id,
    leave the record untouched. ``include_payloads`` keeps request and response in the calls.
    """
    if not capture_dirs:
        return record
    rollout_id = rollout_id_from_run(record, observability_enabled=True)
    if rollout_id is None:
        return record
    stores = [capture_store(d, "merge_model_call_capture_into_record") for d in _each(capture_dirs)]
    store = next((s for s in stores if os.path.exists(s.path_for(rollout_id)) or s.is_incomplete(rollout_id)), None)
    if store is None:
        record[ATTACHMENT_KEY] = {"rollout_id": rollout_id, "metrics": aggregate_model_call_records([], extended=extended),
                                  "calls": [], "gaps": [{"code": GAP_NO_RECORDS}]}
    else:
        record[ATTACHMENT_KEY] = _attachment(store, rollout_id, include_payloads, extended)
    return record


def clear_model_call_captures_for_rollouts(records: Iterable[Mapping[str, Any]],
                                           capture_dirs: Sequence[Where]) -> None:
    """NeMo Gym's entry point: before dispatch, remove the captures of these run rows' rollout ids
    (task, rollout and attempt indices) in every directory."""
    rollout_ids = [rid for row in records if (rid := rollout_id_from_run(row, observability_enabled=True))]
    for directory in _each(capture_dirs):
        capture_store(directory, "clear_model_call_captures_for_rollouts").clear(rollout_ids)


def _each(capture_dirs: Any) -> Sequence[Any]:
    """Gym's entry points take a list of directories; one directory alone is taken as a list of one
    (not read as its characters)."""
    return [capture_dirs] if isinstance(capture_dirs, (str, os.PathLike, CaptureStore)) else capture_dirs


def _attachment(store: CaptureStore, rollout_id: str, include_payloads: bool, extended: bool) -> dict[str, Any]:
    try:
        records, unreadable = _read_tolerantly(store, rollout_id)
    except OSError as exc:  # A directory gone or unreadable: a gap, never an exception in a collector.
        log.warning("cannot read the model-call capture of rollout %s: %s", rollout_id, exc)
        return {"rollout_id": rollout_id, "metrics": aggregate_model_call_records([], extended=extended), "calls": [],
                "gaps": [{"code": GAP_UNREADABLE}]}
    exclude = (set() if include_payloads else set(RAW_PAYLOAD_FIELDS)) | (set() if extended else set(EXTENDED_CALL_FIELDS))
    attachment: dict[str, Any] = {
        "rollout_id": rollout_id,
        "metrics": aggregate_model_call_records(records, extended=extended),
        "calls": [record.model_dump(mode="json", exclude=exclude or None) for record in records],
    }
    gaps = _gaps(store, rollout_id, records, unreadable)
    if gaps:
        attachment["gaps"] = gaps
    return attachment


def _gaps(store: CaptureStore, rollout_id: str, records: list[ModelCallRecord], unreadable: int) -> list[dict[str, Any]]:
    """Gym's order: unreadable lines, then incomplete, or else no records at all."""
    gaps: list[dict[str, Any]] = []
    if unreadable:
        gaps.append({"code": GAP_RECORDS_UNREADABLE, "detail": f"count={unreadable}"})
    if store.is_incomplete(rollout_id):
        gaps.append({"code": GAP_INCOMPLETE})
    elif not records and not unreadable:
        gaps.append({"code": GAP_NO_RECORDS})
    return gaps
