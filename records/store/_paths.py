"""What every reader takes for "where the captures are": a directory path, a `CaptureStore` (issue
47), or a store URL (issue 46: read as Gym's per-rollout files of the store, `store_view`)."""

from __future__ import annotations

import os
from typing import Union

from ..contract.reading import is_store_url

#: A capture directory: a path (``str`` or ``os.PathLike``), or a `CaptureStore` (a path-like of its
#: directory: it has ``__fspath__``).
Where = Union[str, "os.PathLike[str]"]


def directory_of(where: object, taker: str, allow_empty: bool = False) -> str:
    """The directory ``where`` names (a ``str``, an ``os.PathLike`` such as `pathlib.Path`, or a
    `CaptureStore`); anything else is refused in one sentence naming what ``taker`` takes."""
    if isinstance(where, str):
        if is_store_url(where):
            from ._store_view import store_view  # Only a store's readers fetch its segments.
            return store_view(where, allow_empty=allow_empty)
        return where
    if isinstance(where, os.PathLike):
        path = os.fspath(where)
        if isinstance(path, str):
            return path
    raise TypeError(f"{taker} takes a capture directory: a path (str or os.PathLike) or a CaptureStore, "
                    f"not {type(where).__name__} {where!r:.80}")
