"""Read-back API for model-call capture files.

Collectors import this package without the proxy: it depends on pydantic and orjson only
(DESIGN §1). The file contract lives here so the writer (`capture`) and readers share one truth.
"""

from ._errors import InvalidRolloutId, MalformedCaptureLine, RecordsError
from ._file_contract import (
    CAPTURE_SUFFIX,
    CORE_KEYS,
    INCOMPLETE_SUFFIX,
    OPTIONAL_KEYS,
    capture_path,
    encode_capture_line,
    incomplete_marker_path,
)
from ._rollout_ids import ROLLOUT_ID_PATTERN, is_valid_rollout_id, validate_rollout_id
from ._store import CaptureStore, ReadResult
from ._tokens import extract_token_stats

__all__ = [
    "CAPTURE_SUFFIX",
    "CORE_KEYS",
    "CaptureStore",
    "INCOMPLETE_SUFFIX",
    "InvalidRolloutId",
    "MalformedCaptureLine",
    "OPTIONAL_KEYS",
    "ROLLOUT_ID_PATTERN",
    "ReadResult",
    "RecordsError",
    "capture_path",
    "encode_capture_line",
    "extract_token_stats",
    "incomplete_marker_path",
    "is_valid_rollout_id",
    "validate_rollout_id",
]
