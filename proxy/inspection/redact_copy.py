"""`mcc redact SRC DST`: redaction of what was captured before the rules existed (docs/privacy.md,
issue 73). A redacted copy of a capture directory: the same module, rules, hook, placeholders and
fail-closed loading as live capture (`proxy.privacy.load_redaction`, `capture.Redactor`); the
source is only read.

What the copy holds:
- each capture line redacted as live capture redacts it (every member but the sidecar's own:
  `capture.SIDECAR_FIELDS`), or in metrics-only form with ``--privacy metrics-only``; a line the
  hook fails on (raises, or runs past its budget) is written metrics-only, marked
  ``redaction_failed`` and counted; a line that is not JSON (torn by a crash) is left out, counted;
- each training-token entry with its ``output_items`` redacted (the ids and digests stay: token ids
  decode to the text, as in live capture); under metrics-only no token file is copied;
- each end's outcome redacted; everything else (token intents and state, consumers' state, the
  run's end, weight versions, markers, routed experts) copied as it is: it holds no text.

The placeholders are keyed by ``MCC_REDACT_KEY``: give the live sidecars' key to get their
placeholders; without it a key is drawn and the tags match nothing else.
"""

from __future__ import annotations

import concurrent.futures
import os
import secrets
import shutil
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Optional

import orjson

from capture import Redactor, RolloutPlaceholders, metrics_only
from records.contract import CAPTURE_SUFFIX, encode_capture_line
from records.contract.reading import END_SUFFIX

_TOKENS = ".tokens.jsonl"
_LATE_TOKENS = ".tokens.late.jsonl"


@dataclass
class RedactedCopy:
    """What a copy did: lines written, values replaced by rule, lines written metrics-only because
    redaction failed, lines left out because they were not JSON, files copied as they were."""

    lines: int = 0
    replaced: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    unreadable: int = 0
    copied: int = 0


def redact_copy(source: str, target: str, rules: tuple[Any, ...], hook: Optional[Callable[[str], str]],
                budget: float, metrics_only_form: bool, key: Optional[bytes]) -> RedactedCopy:
    """Write the redacted copy of the capture directory ``source`` into ``target`` (new or empty)."""
    source, target = os.path.abspath(source), os.path.abspath(target)
    if target == source or target.startswith(source + os.sep):
        raise ValueError(f"{target} is in the source {source}: the source is never written to")
    if os.path.exists(target) and os.listdir(target):
        raise ValueError(f"{target} is not empty: give a new directory (a redacted copy never mixes with other files)")
    os.makedirs(target, exist_ok=True)
    redactor, key = Redactor(rules, hook), key or secrets.token_bytes(32)
    done = RedactedCopy()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcc-redact-copy") if hook else None
    try:
        for root, directories, files in os.walk(source):
            relative = os.path.relpath(root, source)
            out_root = os.path.join(target, relative) if relative != "." else target
            for name in directories:
                os.makedirs(os.path.join(out_root, name), exist_ok=True)
            for name in files:
                source_path, target_path = os.path.join(root, name), os.path.join(out_root, name)
                if relative == "." and name.endswith(CAPTURE_SUFFIX):
                    rollout_id = name[: -len(CAPTURE_SUFFIX)]
                    _copy_lines(source_path, target_path, partial(
                        _redacted_line, rollout_id=rollout_id, redactor=redactor, key=key, budget=budget,
                        metrics_only_form=metrics_only_form, pool=pool, done=done), done)
                elif relative == "." and (name.endswith(_TOKENS) or name.endswith(_LATE_TOKENS)):
                    if metrics_only_form:
                        continue  # No token file under metrics-only (docs/privacy.md).
                    rollout_id = name.split(".tokens.")[0]
                    _copy_lines(source_path, target_path, partial(
                        _redacted_entry, rollout_id=rollout_id, redactor=redactor, key=key,
                        metrics_only_form=metrics_only_form, done=done), done, count=False)
                elif relative == "." and name.endswith(END_SUFFIX):
                    rollout_id = name[: -len(END_SUFFIX)]
                    with open(source_path, "rb") as handle:
                        end = orjson.loads(handle.read())
                    _redact_member(end, "outcome", rollout_id, redactor, key, metrics_only_form, done)
                    with open(target_path, "wb") as handle:
                        handle.write(orjson.dumps(end))
                else:
                    shutil.copyfile(source_path, target_path)
                    done.copied += 1
    finally:
        if pool is not None:
            pool.shutdown(wait=False)
    return done


def _copy_lines(source: str, target: str, redact: Callable[[dict[str, Any]], dict[str, Any]], done: RedactedCopy,
                count: bool = True) -> None:
    with open(source, "rb") as reading, open(target, "wb") as writing:
        for raw in reading.read().split(b"\n"):
            if not raw.strip():
                continue
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError:
                value = None
            if type(value) is not dict:
                done.unreadable += 1  # Torn by a crash, or damaged: nothing of it is copied.
                continue
            writing.write(encode_capture_line(redact(value)))
            done.lines += count


def _redacted_line(line: dict[str, Any], rollout_id: str, redactor: Redactor, key: bytes, budget: float,
                   metrics_only_form: bool, pool: Optional[concurrent.futures.ThreadPoolExecutor],
                   done: RedactedCopy) -> dict[str, Any]:
    if metrics_only_form:
        metrics_only(line, False)
        line["privacy"] = "metrics-only"
        return line
    placeholders = RolloutPlaceholders(key, rollout_id)
    try:
        if pool is None:
            counts = redactor.redact_line(line, placeholders)
        else:
            copy = dict(line)
            counts = pool.submit(redactor.redact_line, copy, placeholders).result(timeout=budget)
            line = copy
    except Exception:  # The hook's failure (raised, or past its budget): metrics-only, as live capture.
        metrics_only(line, False)
        line["redaction_failed"] = True
        done.failed += 1
        return line
    if counts:
        line["redactions"] = {rule: line.get("redactions", {}).get(rule, 0) + count for rule, count in counts.items()}
        for rule, count in counts.items():
            done.replaced[rule] = done.replaced.get(rule, 0) + count
    return line


def _redacted_entry(entry: dict[str, Any], rollout_id: str, redactor: Redactor, key: bytes, metrics_only_form: bool,
                    done: RedactedCopy) -> dict[str, Any]:
    _redact_member(entry, "output_items", rollout_id, redactor, key, metrics_only_form, done)
    return entry


def _redact_member(value: dict[str, Any], member: str, rollout_id: str, redactor: Redactor, key: bytes,
                   metrics_only_form: bool, done: RedactedCopy) -> None:
    """``value[member]`` redacted as a line's content is (rules, then the hook)."""
    if value.get(member) is None:
        return
    holder = {"request": value[member]}
    if metrics_only_form:
        metrics_only(holder, False)
    else:
        try:
            counts = redactor.redact_line(holder, RolloutPlaceholders(key, rollout_id))
        except Exception:  # The hook's failure: no text of it kept.
            holder = {"request": value[member]}
            metrics_only(holder, False)
            done.failed += 1
            counts = {}
        for rule, count in counts.items():
            done.replaced[rule] = done.replaced.get(rule, 0) + count
    value[member] = holder["request"]


__all__ = ["RedactedCopy", "redact_copy"]
