"""Rollout ids and the URLs that carry them (docs/reading.md; the seed's agent and harness helpers).

Pure functions. The seed gates `rollout_id_from_run`, `url_path_for_run` and `base_url_for_run`
by ``observability_enabled``: when it is off, URLs stay unprefixed and no rollout id is produced.
`url_path_for_request` and `resolve_model_base_url` are not gated, as in NeMo Gym: they carry an
id the caller already has (an inbound prefix, an explicit id), whatever the flag says
(docs/reading.md). Index values are converted as Gym converts them.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional
from urllib.parse import urlsplit, urlunsplit

from ._errors import InvalidRolloutId
from ._rollout_ids import validate_rollout_id

ROLLOUT_PREFIX = "/ng-rollout/"


def rollout_id_from_run(body: Mapping[str, Any], *, observability_enabled: bool) -> Optional[str]:
    """The rollout id of a run request body, or None when off or the body carries none.

    ``_ng_rollout_id`` when given (validated, never sanitised), else
    ``"{_ng_task_index}-{_ng_rollout_index}"`` (each index written as it is given: ``"3"`` and
    ``3`` give the same id); ``-a{n}`` is appended when ``_ng_attempt_index``, read as an int
    (``"2"`` and ``2`` alike; ``True`` is 1), is above 0, so a retry's calls never mix with the
    first attempt's. An attempt index that is not a whole number, or indices that make an
    invalid id, raise `ValueError` (`InvalidRolloutId` is one).
    """
    if not observability_enabled or not isinstance(body, Mapping):
        return None
    explicit = body.get("_ng_rollout_id")
    if explicit is not None:
        base = validate_rollout_id(explicit)
    else:
        task, rollout = body.get("_ng_task_index"), body.get("_ng_rollout_index")
        if task is None or rollout is None:
            return None
        base = f"{task}-{rollout}"
    attempt = _attempt_index(body.get("_ng_attempt_index"))
    return validate_rollout_id(f"{base}-a{attempt}" if attempt > 0 else base)


def url_path_for_run(url_path: str, body: Mapping[str, Any], *, observability_enabled: bool) -> str:
    """``/ng-rollout/<id>`` + ``url_path`` for a downstream call of this run; unchanged when off."""
    rollout_id = rollout_id_from_run(body, observability_enabled=observability_enabled)
    return _prefixed(url_path, rollout_id)


def url_path_for_request(url_path: str, request_path: str, *, observability_enabled: Optional[bool] = None) -> str:
    """Carry an inbound prefixed self-call's rollout id through to the model call it makes.

    Not gated (as NeMo Gym): an inbound prefix means capture is on upstream of this call, so it
    is carried whatever ``observability_enabled`` says (accepted for callers that pass it).
    """
    return _prefixed(url_path, rollout_id_from_path(request_path))


def base_url_for_run(base_url: str, body: Mapping[str, Any], *, observability_enabled: bool) -> str:
    """The SDK ``base_url`` for this run: ``http://host/v1`` -> ``http://host/ng-rollout/<id>/v1``.

    The id is read from the run body (`rollout_id_from_run`): ``_ng_rollout_id``, else
    ``_ng_task_index`` + ``_ng_rollout_index`` (with ``_ng_attempt_index``). A body with neither,
    or observability off, leaves ``base_url`` unchanged: those calls are not captured.
    """
    rollout_id = rollout_id_from_run(body, observability_enabled=observability_enabled)
    return _prefixed_base_url(base_url, rollout_id)


def resolve_model_base_url(name: str, rollout_id: Optional[str] = None, servers: Optional[Mapping[str, str]] = None, *,
                           observability_enabled: Optional[bool] = None) -> str:
    """The base URL of model server ``name`` from ``servers``, prefixed for ``rollout_id`` when given.

    Not gated (as NeMo Gym): a harness that threads an id through its layers got it from
    `rollout_id_from_run`, which is; an explicit id always prefixes, whatever
    ``observability_enabled`` says (accepted for callers that pass it).
    """
    servers = servers or {}
    try:
        base_url = servers[name]
    except KeyError:
        known = ", ".join(sorted(servers)) or "none"
        raise KeyError(f"unknown model server {name!r} (known: {known})") from None
    if rollout_id is None:
        return base_url
    return _prefixed_base_url(base_url, validate_rollout_id(rollout_id))


_ATTEMPT_SUFFIX = re.compile(r"^(.+)-a([1-9][0-9]*)$")


def split_attempt(rollout_id: str) -> tuple[str, int]:
    """``("17-3", 2)`` for ``"17-3-a2"``, ``("17-3", 0)`` for the first attempt: the rollout and
    which attempt of it a capture file holds (the ``-a<n>`` suffix of `rollout_id_from_run`)."""
    found = _ATTEMPT_SUFFIX.match(rollout_id)
    return (found.group(1), int(found.group(2))) if found else (rollout_id, 0)


def rollout_id_from_path(path: str) -> Optional[str]:
    """The rollout id of a ``/ng-rollout/<id>/...`` path, or None (also for an invalid id)."""
    if not path.startswith(ROLLOUT_PREFIX):
        return None
    candidate = path[len(ROLLOUT_PREFIX):].partition("/")[0]
    try:
        return validate_rollout_id(candidate)
    except InvalidRolloutId:
        return None


def _prefixed(url_path: str, rollout_id: Optional[str]) -> str:
    if rollout_id is None:
        return url_path
    return f"{ROLLOUT_PREFIX}{rollout_id}/{url_path.lstrip('/')}"


def _prefixed_base_url(base_url: str, rollout_id: Optional[str]) -> str:
    if rollout_id is None:
        return base_url
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path=_prefixed(parts.path or "/", rollout_id).rstrip("/")))


def _attempt_index(value: Any) -> int:
    """``_ng_attempt_index`` as Gym reads it (``int(value)``); 0 when absent."""
    if value is None:
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"_ng_attempt_index must be a whole number, got {value!r}") from None
