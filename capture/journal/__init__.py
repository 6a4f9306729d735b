"""The journal: every byte of a capture that reaches a disk (docs/layout.md, docs/files.md).

One door for the sidecar, `Journal.submit(rollout_id, build, size, settled)`; behind it the
capture process (both of its ends: `_process_client` in the sidecar, `_process_main` in the child),
the group committer and its writer threads (`_group_commit`), the open files they append to
(`_open_files`). `records` keeps the file contract (the line's encoding, the appender's
primitives) and the readers; the rest of `capture` stays sans-io.
"""

from ._group_commit import SYNC_MODES, AlsoDurable, GroupCommitter
from ._jobs import Job, JobLine
from ._process_main import encode_pickled_fields, frame_line, frame_lines, persist_process_command, pickle_fields
from ._repeats import RepeatLimiter
from ._segments import SegmentFiles, SegmentPolicy, seal_leftovers, sealed_segments
from ._upload import UploadLag, Uploader
from ._upload_process import UploaderProcess
from ._watermark import announce_writer
from ._writer import BUILD_ON_LOOP_BYTES, ENCODE_IN_PROCESS_BYTES, Built, Journal, JournalMetrics, failure_kind, settles

__all__ = [
    "settles",
    "AlsoDurable",
    "BUILD_ON_LOOP_BYTES",
    "Built",
    "ENCODE_IN_PROCESS_BYTES",
    "GroupCommitter",
    "Job",
    "JobLine",
    "Journal",
    "JournalMetrics",
    "RepeatLimiter",
    "SYNC_MODES",
    "SegmentFiles",
    "SegmentPolicy",
    "UploadLag",
    "Uploader",
    "UploaderProcess",
    "announce_writer",
    "encode_pickled_fields",
    "failure_kind",
    "frame_line",
    "frame_lines",
    "persist_process_command",
    "pickle_fields",
    "seal_leftovers",
    "sealed_segments",
]
