"""Logging set-up: one line per problem, as text or as JSON (``--log-format``)."""

from __future__ import annotations

import logging
import sys
import time

import orjson

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


#: Fields a log call may attach with ``extra=``; JSON lines carry them as keys of their own.
CONTEXT_FIELDS = ("rollout_id", "status", "errno", "path", "kind", "count", "upstream", "method", "worker")


def utc_timestamp(created: float | None = None) -> str:
    created = time.time() if created is None else created
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, and
    ``rollout_id``, ``status``, ``errno``, ... where the line is about one (`CONTEXT_FIELDS`)[, ``exception``]."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": utc_timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in CONTEXT_FIELDS:
            value = record.__dict__.get(field)
            if value is not None:
                entry[field] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def configure_logging(level: str, log_format: str = "text", worker: tuple[int, int] | None = None) -> None:
    """Send the sidecar's logs to stderr at ``level`` in ``log_format`` (``text`` or ``json``).

    ``worker`` (slot, count): a process of ``--workers``, whose every line says which one wrote it
    (``mcc[worker 2/4]:`` in text, ``"worker": 2`` in JSON); the supervisor's own lines say none."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    elif worker is not None:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT.replace("%(name)s:", f"%(name)s[worker {worker[0]}/{worker[1]}]:")))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    if worker is not None:
        handler.addFilter(_WorkerTag(worker[0]))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiohttp logs every closed connection at debug and some client errors at error; the
    # sidecar already reports those once per call, so keep aiohttp's own at warning.
    logging.getLogger("aiohttp").setLevel(max(logging.WARNING, root.level))


class _WorkerTag(logging.Filter):
    """Marks every record with the worker's slot (the ``worker`` key of a JSON line)."""

    def __init__(self, slot: int) -> None:
        super().__init__()
        self.slot = slot

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.slot
        return True
