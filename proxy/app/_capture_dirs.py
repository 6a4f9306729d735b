"""The capture directory as a sidecar starts (docs/operations.md, "Running it"): made when it is
missing (and said loudly when its parent was missing too: an unmounted volume), checked writable,
and its filesystem checked for several nodes sharing it; the token dir made beside it.

A capture fault never stops the sidecar: everything here is said in the log, and calls are
forwarded whatever it finds (docs/guarantees.md).
"""

from __future__ import annotations

import logging
import os

from records.contract import filesystem_type

from ..call import directory_writable
from ._filesystems import layout_caveat, mount_options
from ._settings import Settings

log = logging.getLogger("mcc")


def prepare_capture_dirs(settings: Settings) -> bool:
    """Make and check ``settings.capture_dir`` and the token dir; whether the capture dir is writable."""
    assert settings.capture_dir is not None
    writable = True
    if not os.path.isdir(settings.capture_dir):
        parent = os.path.dirname(settings.capture_dir.rstrip("/")) or "/"
        parent_missing = not os.path.isdir(parent)
        try:
            os.makedirs(settings.capture_dir, exist_ok=True)
            if parent_missing:
                # Not even the parent existed: an unmounted volume or a typo, whose captures
                # would land on the container's ephemeral storage.
                log.warning("the capture dir %s did not exist, nor did its parent %s: created both; if a volume "
                            "should be mounted there, it is not (captures go to local storage)",
                            settings.capture_dir, parent, extra={"path": settings.capture_dir})
            else:
                log.info("created the capture dir %s", settings.capture_dir, extra={"path": settings.capture_dir})
        except OSError as exc:
            log.error("cannot create capture dir %s: %s; calls are forwarded, capture will fail until it exists",
                      settings.capture_dir, exc.strerror or exc, extra={"path": settings.capture_dir, "errno": exc.errno})
    if os.path.isdir(settings.capture_dir) and not directory_writable(settings.capture_dir):
        log.warning("capture dir %s is not writable by uid %d: calls are forwarded, their lines are lost "
                    "until it is (on Kubernetes, set the pod's fsGroup)", settings.capture_dir, os.getuid(),
                    extra={"path": settings.capture_dir})
        writable = False
    caveat = (layout_caveat(filesystem_type(settings.capture_dir), mount_options(settings.capture_dir))
              if settings.capture_store is None else None)
    if caveat is not None:  # Said once, with the fix: safe for this node alone, not for several.
        log.warning("the capture dir %s is on %s: several sidecars writing the same rollouts from different "
                    "nodes can interleave or lose lines there; give each sidecar a local spool and "
                    "--capture-store (segments:///shared/path, or s3://, gs://, az://) instead",
                    settings.capture_dir, caveat, extra={"path": settings.capture_dir})
    token_dir = settings.token_dir or settings.capture_dir
    try:
        os.makedirs(token_dir, exist_ok=True)
    except OSError as exc:  # Said; the entries then fail (counted), never a call.
        log.warning("cannot create the token dir %s: %s", token_dir, exc.strerror or exc, extra={"path": token_dir})
    return writable


__all__ = ["prepare_capture_dirs"]
