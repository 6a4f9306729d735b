"""Pure stream parsing and the durable appender (DESIGN §1, §3, §6).

No aiohttp and no sockets here: the parsers and reassemblers take bytes and return values, in the
manner of h11; the appender, the group committer and the capture process built on it are all
that touch the disk (the capture process reads its lines from a descriptor it is handed).
"""

from records import append_capture_line, create_incomplete_marker
from ._categories import ERROR_CATEGORIES, categorize_status, is_aborted_reply, is_context_length_error
from ._chat import ChatReassembler
from ._completions import CompletionsReassembler
from ._decoding import UnsupportedContentEncoding, make_decoder
from .journal._group_commit import SYNC_MODES, AlsoDurable, GroupCommitter
from ._messages import MessagesReassembler
from .journal._process_main import ACK as PERSIST_ACK
from .journal._process_main import FIELDS as PERSIST_FIELDS
from .journal._process_main import LINE as PERSIST_LINE
from .journal._process_main import NOT_ENCODED as PERSIST_NOT_ENCODED
from .journal._process_main import READY as PERSIST_READY
from .journal._process_main import encode_pickled_fields, frame_line, frame_lines, persist_process_command, pickle_fields
from ._prefix_supply import PrefixRenders, proves_prefix, render_requests, tokenized_ids
from ._reassembler import Reassembler
from ._responses import ResponsesReassembler
from ._sse import DEFAULT_MAX_EVENT_BYTES, EventBlock, ServerSentEvent, SSEParser
from ._tap import REASSEMBLERS, BodyTap, StreamTap, TapOutcome, parse_json_object
from ._token_cutter import AddedFieldCutter
from ._token_request import TOKEN_FIELDS, add_request_fields, token_fields_to_add, vllm_bool

__all__ = [
    "AddedFieldCutter",
    "AlsoDurable",
    "BodyTap",
    "ChatReassembler",
    "CompletionsReassembler",
    "DEFAULT_MAX_EVENT_BYTES",
    "ERROR_CATEGORIES",
    "EventBlock",
    "GroupCommitter",
    "MessagesReassembler",
    "PERSIST_ACK",
    "PERSIST_FIELDS",
    "PERSIST_LINE",
    "PERSIST_NOT_ENCODED",
    "PERSIST_READY",
    "PrefixRenders",
    "REASSEMBLERS",
    "Reassembler",
    "ResponsesReassembler",
    "SYNC_MODES",
    "SSEParser",
    "ServerSentEvent",
    "StreamTap",
    "TOKEN_FIELDS",
    "TapOutcome",
    "UnsupportedContentEncoding",
    "add_request_fields",
    "append_capture_line",
    "categorize_status",
    "create_incomplete_marker",
    "encode_pickled_fields",
    "frame_line",
    "frame_lines",
    "is_aborted_reply",
    "is_context_length_error",
    "make_decoder",
    "parse_json_object",
    "persist_process_command",
    "pickle_fields",
    "proves_prefix",
    "render_requests",
    "token_fields_to_add",
    "tokenized_ids",
    "vllm_bool",
]
