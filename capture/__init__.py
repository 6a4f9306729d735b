"""Pure stream parsing (docs/layout.md, docs/files.md), and the journal (`capture.journal`, docs/files.md).

No aiohttp and no sockets in the parsers: they take bytes and return values, in the manner of h11.
Everything that touches a disk, a socket or a process is in `capture.journal`, behind its own door.
"""

from ._categories import ERROR_CATEGORIES, categorize_status, is_aborted_reply, is_context_length_error
from ._chat import ChatReassembler, CollectedArrays
from ._completions import CompletionsReassembler
from ._cutting_tap import CuttingStreamTap
from ._decoding import MAX_DECODED_BYTES, DecodedTooLarge, UnsupportedContentEncoding, as_evidence, decodable, make_decoder
from ._messages import MessagesReassembler
from ._native import description as per_event_core
from ._prefix_supply import (
    PrefixRenders, proves_prefix, render_requests, reported_prompt_ids, responses_render_request, tokenized_ids,
)
from ._reassembler import Reassembler
from ._responses import ResponsesReassembler
from ._sse import DEFAULT_MAX_EVENT_BYTES, EventBlock, ServerSentEvent, SSEParser
from ._tap import REASSEMBLERS, BodyTap, StreamTap, TapOutcome, parse_json_object, reply_expectations
from ._redaction import (
    CONTENT_FIELDS, CONTENT_REMOVED, SIDECAR_FIELDS, RedactionConfigError, Redactor, RolloutPlaceholders, Rule, load_rules, metrics_only,
)
from ._token_cutter import REMOVE_MEMBER, AddedFieldCutter
from ._token_request import SGLANG_TOKEN_FIELDS, TOKEN_FIELDS, add_request_fields, token_fields_to_add, vllm_bool

__all__ = [
    "AddedFieldCutter",
    "BodyTap",
    "ChatReassembler",
    "CollectedArrays",
    "CompletionsReassembler",
    "CuttingStreamTap",
    "DEFAULT_MAX_EVENT_BYTES",
    "ERROR_CATEGORIES",
    "EventBlock",
    "MessagesReassembler",
    "PrefixRenders",
    "REASSEMBLERS",
    "Reassembler",
    "ResponsesReassembler",
    "SSEParser",
    "ServerSentEvent",
    "StreamTap",
    "TOKEN_FIELDS",
    "TapOutcome",
    "DecodedTooLarge",
    "MAX_DECODED_BYTES",
    "UnsupportedContentEncoding",
    "as_evidence",
    "decodable",
    "add_request_fields",
    "categorize_status",
    "is_aborted_reply",
    "is_context_length_error",
    "make_decoder",
    "parse_json_object",
    "per_event_core",
    "proves_prefix",
    "render_requests",
    "reported_prompt_ids",
    "responses_render_request",
    "reply_expectations",
    "token_fields_to_add",
    "CONTENT_FIELDS",
    "CONTENT_REMOVED",
    "SIDECAR_FIELDS",
    "RedactionConfigError",
    "Redactor",
    "RolloutPlaceholders",
    "Rule",
    "load_rules",
    "metrics_only",
    "REMOVE_MEMBER",
    "SGLANG_TOKEN_FIELDS",
    "tokenized_ids",
    "vllm_bool",
]
