"""Reading records back, and attaching them to rollout records (DESIGN §7, §8; the seed's collector)."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from ._record import RAW_PAYLOAD_FIELDS, aggregate_model_call_records, build_model_call_record
from ._models import ModelCallRecord
from ._rollouts import rollout_id_from_run
from ._store import CaptureStore, gc_paused

#: The key `attach_model_call_capture` adds to a rollout record.
ATTACHMENT_KEY = "ng_model_call_capture"


def read_model_call_records(store: CaptureStore, rollout_id: str, *, strict: bool = False) -> list[ModelCallRecord]:
    """The rollout's calls as records, in append order.

    Tolerant by default: a torn or malformed line is skipped (``store.read_available`` reports
    it); ``strict=True`` raises on one instead.
    """
    if strict:
        with gc_paused():  # One pause around parsing and building: see `gc_paused`.
            lines = store.read(rollout_id)
            return [build_model_call_record(line, index) for index, line in enumerate(lines)]
    records, _ = _read_tolerantly(store, rollout_id)
    return records


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


def aggregate_model_call_metrics(store: CaptureStore, rollout_id: str,
                                 percentiles: Iterable[float] = ()) -> dict[str, Any]:
    """Totals over the rollout's calls (see `aggregate_model_call_records`)."""
    return aggregate_model_call_records(read_model_call_records(store, rollout_id), percentiles)


def clear_model_call_captures(rollout_ids: Iterable[str], capture_dir: str) -> None:
    """Before dispatch: remove the capture file and incomplete marker of exactly these ids,
    so a redispatched (or kill-shaped) attempt never mixes with an earlier one."""
    CaptureStore(capture_dir).clear(rollout_ids)


def attach_model_call_capture(rollout_record: Mapping[str, Any], capture_dir: str,
                              rollout_id: Optional[str] = None) -> dict[str, Any]:
    """A copy of ``rollout_record`` with ``ng_model_call_capture = {rollout_id, metrics, calls[, gaps]}``.

    Every other key is left exactly as it was. The rollout id is taken from the record's
    ``_ng_*`` fields unless given. Attached calls omit ``request``, ``response``, ``request_raw``
    and ``response_raw``; those stay in the capture files. ``gaps`` lists what is missing:
    ``no_records``, ``records_unreadable`` (with a count) and ``incomplete``.
    """
    if rollout_id is None:
        rollout_id = rollout_id_from_run(rollout_record, observability_enabled=True)
    attached = dict(rollout_record)
    if rollout_id is None:
        attached[ATTACHMENT_KEY] = {"rollout_id": None, "metrics": {"num_calls": 0}, "calls": [],
                                    "gaps": [{"kind": "no_records"}]}
        return attached
    store = CaptureStore(capture_dir)
    records, unreadable = _read_tolerantly(store, rollout_id)
    attachment: dict[str, Any] = {
        "rollout_id": rollout_id,
        "metrics": aggregate_model_call_records(records),
        "calls": [record.model_dump(mode="json", exclude=RAW_PAYLOAD_FIELDS) for record in records],
    }
    gaps = _gaps(store, rollout_id, records, unreadable)
    if gaps:
        attachment["gaps"] = gaps
    attached[ATTACHMENT_KEY] = attachment
    return attached


def _gaps(store: CaptureStore, rollout_id: str, records: list[ModelCallRecord], unreadable: int) -> list[dict[str, Any]]:
    gaps: list[dict[str, Any]] = []
    if not records:
        gaps.append({"kind": "no_records"})
    if unreadable:
        gaps.append({"kind": "records_unreadable", "count": unreadable})
    if store.is_incomplete(rollout_id):
        gaps.append({"kind": "incomplete"})
    return gaps
