"""Which filesystems the default layout (one file per rollout, appended under ``flock`` by every
writer: docs/files.md) is safe on, said once at start-up (docs/files.md, issue 46, point 5).

Read from the mount table (`records.contract.filesystem_type`, and the mount's options): on a node's own
disk (ext4, xfs, btrfs, tmpfs, overlay) and on a filesystem whose locks and appends hold across
its clients (CephFS, Lustre mounted with ``flock``), several sidecars may append to one rollout's
file. Where they do not -- ``O_APPEND`` is not atomic across NFS clients whose locks are local
(``nolock``, ``local_lock``); ``flock`` is node-local on GPFS and on FUSE mounts; object-storage mounts (gcsfuse, Mountpoint for S3, s3fs-fuse) do not
append at all -- the lines of two nodes can interleave or overwrite each other, and writer
segments (``--capture-store``) are the fix.
"""

from __future__ import annotations

from typing import Optional

from records.contract.writing import mount_of

_UNSAFE = {
    "gpfs": "flock is node-local on GPFS (Spectrum Scale): another node's appends do not wait for it",
    "cifs": "SMB mounts do not make appends atomic across clients",
    "smb3": "SMB mounts do not make appends atomic across clients",
    "9p": "9p mounts do not make locks or appends hold across clients",
}


def layout_caveat(fstype: Optional[str], options: str = "") -> Optional[str]:
    """Why the default layout is not safe for writers on several nodes on ``fstype``, else None."""
    if fstype is None:
        return None
    if fstype.startswith("fuse"):
        return (f"{fstype} (a FUSE mount: gcsfuse, Mountpoint for S3 and s3fs-fuse do not append; flock on FUSE "
                "is not seen by other nodes)")
    flags = options.split(",")
    if fstype == "lustre" and "flock" not in flags:
        return "lustre mounted without the flock option: flock is refused or local to this node"
    if fstype in ("nfs", "nfs4") and ("nolock" in flags or "local_lock=flock" in flags or "local_lock=all" in flags):
        # With its locks the server's, an NFS append under flock is safe: the lock revalidates the
        # size. Without them, O_APPEND is not atomic across clients (two nodes take the same end).
        return f"{fstype} mounted with local locks (nolock or local_lock): O_APPEND is not atomic across NFS clients"
    reason = _UNSAFE.get(fstype)
    return f"{fstype} ({reason})" if reason is not None else None


def mount_options(directory: str, mountinfo: Optional[str] = None) -> str:
    """The super options of the mount ``directory`` is on (``/proc/self/mountinfo``), '' if unknown."""
    return mount_of(directory, mountinfo)[1]


__all__ = ["layout_caveat", "mount_options"]
