"""MoE routed experts read back (docs/tokens.md, "Routed experts"): a call's rows, or a chain's
rows aligned with its tokens, from the objects the token capture mode stored apart
(``--capture-routed-experts``), each verified by its sha256, dtype and shape."""

from __future__ import annotations

import os
import re
from typing import Any, Optional, Union

from ..contract import ObjectStore, RoutedExperts, RoutedExpertsProblem, TokenRecord, expert_object_name
from ..contract.reading import aligned_routed_experts, experts_path, is_store_url, load_routed_experts
from ..store import CaptureStore, directory_of
from ._trajectories import CallSpan, Trajectory

_SHA256 = re.compile(r"[0-9a-f]{64}")


def read_routed_experts(where: Union[str, "os.PathLike[str]", CaptureStore], rollout_id: str,
                        of: Union[Trajectory, TokenRecord, CallSpan, dict[str, Any]]) -> Optional[RoutedExperts]:
    """The routed experts of ``of``: a `Trajectory`'s aligned with its tokens (a row per token but
    the last, rows no call stored holding `records.contract.MISSING_ROUTE`); a `TokenRecord`'s or a
    `CallSpan`'s (its call's own rows, from token ``start``); or a reference's (a token entry's
    ``routed_experts``). None when none were stored. ``where``: the token files' directory, a
    `CaptureStore` or a store URL (the objects fetched from the store when not beside the files).
    `RoutedExpertsProblem` when an object is missing or is not what its reference says."""
    if isinstance(of, Trajectory):
        parts = [_load(where, rollout_id, call.routed_experts) if call.routed_experts is not None else None
                 for call in of.calls]
        return aligned_routed_experts(parts, len(of.token_ids))
    reference = of.routed_experts if isinstance(of, (TokenRecord, CallSpan)) else of
    return None if reference is None else _load(where, rollout_id, reference)


def _load(where: object, rollout_id: str, reference: Any) -> RoutedExperts:
    sha256 = reference.get("sha256") if isinstance(reference, dict) else None
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        raise RoutedExpertsProblem(f"not a routed-experts reference: {reference!r:.200}")
    path = experts_path(directory_of(where, "read_routed_experts"), rollout_id, sha256)
    try:
        with open(path, "rb") as handle:
            blob: Optional[bytes] = handle.read()
    except FileNotFoundError:
        url = _store_url(where)
        blob = ObjectStore(url).get_if_present(expert_object_name(sha256)) if url is not None else None
    if blob is None:
        raise RoutedExpertsProblem(f"the routed experts {sha256} of rollout {rollout_id} are not in {where}")
    return load_routed_experts(blob, reference)


def _store_url(where: object) -> Optional[str]:
    """The capture store's URL ``where`` reads, if it is one (a URL, a `CaptureStore` or a `records.Captures` on one)."""
    if isinstance(where, str):
        return where if is_store_url(where) else None
    store = where if isinstance(where, CaptureStore) else getattr(where, "store", None)
    return store.url if isinstance(store, CaptureStore) else None
