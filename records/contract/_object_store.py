"""Write-once objects under one store URL (docs/files.md): the writer's uploads and the readers' reads.

``segments:///path`` is a path (local, or a shared filesystem): each object a file, written to a
temporary name, fsynced, then renamed, so no reader ever sees part of one. ``s3://bucket/prefix``,
``gs://bucket/prefix`` and ``az://container/prefix`` go through fsspec (s3fs, gcsfs, adlfs: the
``store`` extra), whose single PUT of a whole object is atomic on every such service. Credentials
and an S3 endpoint come from the services' own environment (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ...), never from a URL, a line or a log.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Optional

from ._appender import fsync_directory

#: The schemes a store URL may have.
STORE_SCHEMES = ("segments", "s3", "gs", "az")
_FSSPEC_PROTOCOLS = {"s3": "s3", "gs": "gcs", "az": "az"}


def is_store_url(value: object) -> bool:
    """Whether ``value`` is a store URL (``segments://``, ``s3://``, ``gs://``, ``az://``)."""
    if not isinstance(value, str):
        return False
    scheme, separator, _ = value.partition("://")
    return bool(separator) and scheme in STORE_SCHEMES


class StoreUnavailable(RuntimeError):
    """The store's library is not installed, or the URL is not one."""


class ObjectStore:
    """Objects by name (``/``-separated) under one store URL."""

    def __init__(self, url: str) -> None:
        if not is_store_url(url):
            raise StoreUnavailable(f"not a store URL: {url!r} (segments:///path, s3://, gs://, az://)")
        self.url = url.rstrip("/")
        scheme, _, rest = self.url.partition("://")
        self._fs: Any = None
        if scheme == "segments":
            self._root = "/" + rest.lstrip("/")
            return
        try:
            import fsspec
        except ImportError:
            raise StoreUnavailable(f"{scheme}:// needs fsspec and its {scheme} filesystem: "
                                   "pip install fsspec s3fs (or the checkout's '.[store]' extra)") from None
        try:
            self._fs = fsspec.filesystem(_FSSPEC_PROTOCOLS[scheme], **_options(scheme))
        except (ImportError, ValueError) as exc:
            raise StoreUnavailable(f"{scheme}:// cannot be opened: {exc} (pip install fsspec s3fs, gcsfs or adlfs)") from None
        self._root = rest.strip("/")

    def local_path(self, name: str) -> Optional[str]:
        """The file that holds ``name`` on a ``segments://`` path; None on an object store."""
        return self._path(name) if self._fs is None else None

    def _path(self, name: str) -> str:
        return f"{self._root}/{name}" if self._fs is not None else os.path.join(self._root, *name.split("/"))

    def put(self, name: str, data: bytes) -> None:
        """Write ``data`` as the whole object ``name`` (again: the same bytes, idempotent)."""
        if self._fs is not None:
            self._fs.pipe_file(self._path(name), data)
            return
        path = self._path(name)
        os.replace(_written_aside(path, data, durable=True), path)
        fsync_directory(os.path.dirname(path))

    def create(self, name: str, data: bytes, durable: bool = True) -> bool:
        """Write ``data`` as the new object ``name``, whole and durable: False when ``name`` exists
        (left as it is). Of two writers of one name exactly one succeeds: a conditional put that
        fails when the object exists (``If-None-Match: *`` on S3, fsspec's ``mode="create"``), a
        hard link on a path. The live hand-off's ends, claims and acks (docs/reading.md).
        ``durable=False`` on a path: made durable by the caller's `sync` (one barrier for a batch)."""
        if self._fs is not None:
            try:
                self._fs.pipe_file(self._path(name), data, mode="create")
            except FileExistsError:
                return False
            return True
        return create_file_exclusively(self._path(name), data, durable)

    def sync(self) -> None:
        """Every object created with ``durable=False`` is durable: one ``syncfs`` of the path's
        filesystem (else a ``sync``); nothing for an object store, whose put is durable when it returns."""
        if self._fs is None:
            from ._group_sync import sync_filesystem

            sync_filesystem(self._root)

    def get_if_present(self, name: str) -> Optional[bytes]:
        """The object's bytes, or None when there is none."""
        try:
            return self.get(name)
        except FileNotFoundError:
            return None

    def get_many(self, names: list[str]) -> dict[str, bytes]:
        """The objects that exist of ``names``, by name: on an object store, fetched concurrently
        (fsspec's ``cat`` of many paths), so a consumer that starts reads a run's ends in a few
        round trips, not one each."""
        if self._fs is None:
            found = {}
            for name in names:
                data = self.get_if_present(name)
                if data is not None:
                    found[name] = data
            return found
        if not names:
            return {}
        paths = {self._path(name): name for name in names}
        fetched = self._fs.cat(list(paths), on_error="omit")
        return {paths[path]: data for path, data in fetched.items() if path in paths and isinstance(data, bytes)}

    def get(self, name: str) -> bytes:
        if self._fs is not None:
            return self._fs.cat_file(self._path(name))
        with open(self._path(name), "rb") as handle:
            return handle.read()

    def names(self, prefix: str) -> list[str]:
        """Every object's name under ``prefix/``, sorted (temporary files left out)."""
        if self._fs is not None:
            base = self._path(prefix)
            try:
                found = self._fs.find(base)
            except FileNotFoundError:
                return []
            self._fs.invalidate_cache()
            # Objects only: ``find`` may also give the prefix itself (a fresh prefix, listed as its
            # first object lands) or a folder marker, neither of which is an object to read.
            inside = (path[len(base):].lstrip("/") for path in found)
            return sorted(f"{prefix}/{name}" for name in inside if name and not name.endswith("/"))
        root = self._path(prefix)
        names = []
        for directory, _, files in os.walk(root):
            relative = os.path.relpath(directory, self._root).replace(os.sep, "/")
            names += [f"{relative}/{name}" for name in files if not name.endswith(".part")]
        return sorted(names)

    def children(self, prefix: str) -> list[str]:
        """The names of the folders directly under ``prefix/`` (a writer's, a spool's), sorted: one
        listing with a delimiter on an object store."""
        if self._fs is None:
            try:
                return sorted(entry.name for entry in os.scandir(self._path(prefix)) if entry.is_dir())
            except FileNotFoundError:
                return []
        try:
            found = self._fs.ls(self._path(prefix), detail=True, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(item["name"].rstrip("/").rpartition("/")[2] for item in found if item.get("type") == "directory")

    def names_after(self, prefix: str, after: str) -> list[str]:
        """The names under ``prefix/`` that sort after ``after`` (a whole name, which need not
        exist), sorted: what a listing costs grows with what is new, not with what is there. S3:
        one ``ListObjectsV2`` with ``StartAfter`` (a page per 1,000 names); a path: only the
        folders at or after ``after``'s at each level are read; other object stores list the
        prefix and keep what sorts after (no start-after in their fsspec filesystems)."""
        if self._fs is None:
            root = self._path(prefix)
            rest = after[len(prefix) + 1:].split("/") if after.startswith(prefix + "/") else []
            return [f"{prefix}/{name}" for name in walk_names_after(root, rest)]
        if type(self._fs).__name__ == "S3FileSystem":
            bucket, _, key_prefix = self._path(prefix).partition("/")
            start = self._path(after).partition("/")[2]
            names, token = [], None
            while True:
                kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key_prefix + "/", "StartAfter": start}
                if token:
                    kwargs["ContinuationToken"] = token
                page = self._fs.call_s3("list_objects_v2", **kwargs)
                base = len(key_prefix) + 1
                names += [f"{prefix}/{item['Key'][base:]}" for item in page.get("Contents", ())
                          if not item["Key"].endswith("/")]
                token = page.get("NextContinuationToken")
                if not page.get("IsTruncated") or not token:
                    return names
        return [name for name in self.names(prefix) if name > after]


def walk_names_after(root: str, rest: list[str]) -> list[str]:
    """The files under ``root`` (relative, ``/``-separated, sorted) that sort after the path whose
    parts are ``rest`` (empty: every file); a folder before ``rest[0]`` is not read."""
    try:
        entries = sorted(os.scandir(root), key=lambda entry: entry.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        name = entry.name
        if name.endswith(".part") or name.startswith("."):
            continue
        if rest and name < rest[0]:
            continue
        if entry.is_dir(follow_symlinks=False):
            deeper = rest[1:] if rest and name == rest[0] else []
            found += [f"{name}/{inner}" for inner in walk_names_after(entry.path, deeper)]
        elif not rest or name > rest[0]:
            found.append(name)
    return found


def create_file_exclusively(path: str, data: bytes, durable: bool = True) -> bool:
    """Write ``data`` as the new file ``path``: False when ``path`` exists (left as it is). Written
    whole under a temporary name, then hard-linked (which fails when the name exists), so a reader
    never sees half of it and of two writers of one name exactly one succeeds. ``durable=False``:
    the caller makes it durable (one barrier for a batch)."""
    temporary = _written_aside(path, data, durable)
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(temporary)
    if durable:
        fsync_directory(os.path.dirname(path))
    return True


def _written_aside(path: str, data: bytes, durable: bool) -> str:
    """``data`` in a temporary file beside ``path`` (``.<name>.<random>.part``: no reader lists
    it), its directory made first; fsynced when ``durable``. The temporary file's path."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:8]}.part")
    with open(temporary, "wb") as handle:
        handle.write(data)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    return temporary


def _options(scheme: str) -> dict[str, Any]:
    """The filesystem's options from the environment: an S3 endpoint (``AWS_ENDPOINT_URL``, which
    MinIO, Ceph and the tests' server need); the rest each library reads itself."""
    if scheme == "s3" and os.environ.get("AWS_ENDPOINT_URL"):
        return {"endpoint_url": os.environ["AWS_ENDPOINT_URL"], "use_listings_cache": False}
    return {"use_listings_cache": False} if scheme == "s3" else {}


__all__ = ["ObjectStore", "STORE_SCHEMES", "StoreUnavailable", "create_file_exclusively", "is_store_url"]
