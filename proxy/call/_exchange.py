"""One observed model call as the proxy sees it, and the capture line it becomes (docs/files.md)."""

from __future__ import annotations

import functools
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from capture import (BodyTap, StreamTap, TapOutcome, as_evidence, decodable, is_aborted_reply, make_decoder,
                     parse_json_object)

from ..http import Headers, first_values, single_value
from ._retries import RetryMemory
from ._routing import HARNESS_AGENT_HEADERS, HARNESS_PARENT_AGENT_HEADERS, HARNESS_SESSION_HEADERS

MODEL_REF_TYPE = "responses_api_models"
_OMITTED_WHEN_NONE = frozenset(
    {"client_session_id", "client_assistant_message_id", "client_agent_id", "client_parent_agent_id", "request_raw",
     "response_raw", "stream_truncated", "failure",
     "added_request_fields", "retry_of"}
)


@dataclass
class Failure:
    """docs/files.md ``failure``: what went wrong, in one object."""

    stage: str
    category: str
    message: str
    exception_type: str | None = None
    retryable: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "category": self.category,
            "message": self.message,
            "exception_type": self.exception_type,
            "retryable": self.retryable,
        }


def new_call_id() -> str:
    """A random (version 4) UUID as 32 hex digits (docs/files.md ``model_call_id``).

    From a generator seeded once per process from the OS, not ``uuid4()``: that asks the kernel
    for 16 bytes on every call, one syscall per model call for an id that only has to be unique.
    """
    bits = _ids.getrandbits(128)
    bits = (bits & ~(0xF000 << 64)) | (0x4000 << 64)  # Version 4.
    bits = (bits & ~(0xC000 << 48)) | (0x8000 << 48)  # RFC 4122 variant.
    return f"{bits:032x}"


_ids = random.Random(os.urandom(32))


@dataclass(slots=True)
class CallExchange:
    """Timings, transport facts and the tap of one call; `capture_fields` makes its line."""

    rollout_id: str
    dialect: str
    model_name: str
    request_body: bytes
    request_encoding: str | None = None
    client_session_id: str | None = None
    client_assistant_message_id: str | None = None
    #: The harness's agent within the session, and its parent agent (a subagent's): evidence.
    client_agent_id: str | None = None
    client_parent_agent_id: str | None = None
    #: The client's request headers. The correlation ids and the body's encoding are read from
    #: them when the line is made, once the reply has ended: not on the way to the first byte.
    request_headers: Headers | None = None
    #: The same headers' first values by lower-case name (`ServerRequest.fields`), when known.
    request_fields: dict[bytes, bytes] | None = None
    #: Names of the session and assistant-message id headers.
    correlation_headers: tuple[str, str] = ("x-session-id", "x-assistant-message-id")
    tap: StreamTap | BodyTap | None = None
    #: ``always`` or ``on-failure``: when a stream's ``response_raw`` goes on the line (Settings).
    raw_stream: str = "always"
    started_at: float | None = None
    completed_at: float | None = None
    latency_ms: float | None = None
    latency_ttft_ms: float | None = None
    status_code: int | None = None
    upstream_attempted: bool = False
    upstream_status_code: int | None = None
    response_source: str = "upstream"
    local_response_reason: str | None = None
    #: A category the proxy knows better than the reply does (cancelled, timeout, connection).
    category_override: str | None = None
    failure: Failure | None = None
    #: The error body of a reply the sidecar wrote itself.
    local_body: dict[str, Any] | None = None
    #: Token capture mode (docs/tokens.md): the fields the sidecar added to the request sent upstream.
    added_request_fields: dict[str, Any] | None = None
    #: The request body already parsed on the way in (the token capture mode reads it): not parsed twice.
    parsed_request: dict[str, Any] | None = None
    #: Why the call is a side call (not the policy's turn: another model, a harness's title or
    #: quota call; `proxy.training._side_calls`), "" when decided it is a turn, None until decided.
    side_call: str | None = None
    #: The earlier call of the rollout this one repeats (an SDK retry, a resend): byte for byte,
    #: noted as the call opens, or equal as JSON (`note_json_retry`).
    retry_of: str | None = None
    #: Where the rollout's recent requests are remembered (`RetryMemory`); None: not looked for.
    retries: RetryMemory | None = None
    model_call_id: str = field(default_factory=new_call_id)
    _started_monotonic: float = 0.0
    _json_retry_noted: bool = False

    def note_json_retry(self, request: Any) -> None:
        """Note the parsed request (once per call) and, when no byte-equal call was found, take the
        latest earlier call that is equal to it as JSON, key order aside (issue 44, point 5)."""
        if self.retries is None or self._json_retry_noted or type(request) is not dict:
            return
        self._json_retry_noted = True
        earlier = self.retries.note_json(self.rollout_id, request, self.model_call_id)
        if self.retry_of is None:
            self.retry_of = earlier

    def generated_so_far(self) -> dict[int, int] | None:
        """Per choice, the generated ids relayed so far (a declared weight update's split point), or
        None when a reply cannot be counted mid-way. Before the reply's head: none for a stream
        (a server sends its head before the first token), unknown for a JSON reply (its head
        comes when the generation is done). Asked only when a version is declared."""
        tap = self.tap
        if tap is None:
            request = self.parsed_request if self.parsed_request is not None else parse_json_object(self.request_body)
            return {} if isinstance(request, dict) and request.get("stream") is True else None
        return tap.generated_so_far() if isinstance(tap, StreamTap) else None

    def start(self) -> None:
        """Taken immediately before the request goes upstream (docs/files.md)."""
        self.started_at = time.time()
        self._started_monotonic = time.monotonic()
        self.upstream_attempted = True

    def mark_first_content(self) -> None:
        if self.latency_ttft_ms is None and self.started_at is not None:
            self.latency_ttft_ms = (time.monotonic() - self._started_monotonic) * 1000.0

    def complete(self) -> None:
        """The upstream exchange ended (last byte, error or cancel), before parsing and persistence."""
        if self.completed_at is not None:
            return
        if self.started_at is None:  # Refused before anything went upstream (body too large).
            self.started_at = time.time()
            self._started_monotonic = time.monotonic()
        self.completed_at = time.time()
        self.latency_ms = (time.monotonic() - self._started_monotonic) * 1000.0

    def answer_locally(self, status: int, reason: str, category: str, failure: Failure, body: dict[str, Any]) -> None:
        self.local_body = body
        self.status_code = status
        self.response_source = "local"
        self.local_response_reason = reason
        self.category_override = category
        self.failure = failure

    def capture_fields(self) -> dict[str, Any]:
        """The line's fields. Parses the request and finishes the tap: once the reply has ended
        (on the event loop for a small call, else on a thread: `capture.journal._writer`)."""
        if self.request_headers is not None:
            self._read_request_headers(self.request_headers)
        fields: dict[str, Any] = {
            "model_call_id": self.model_call_id,
            "dialect": self.dialect,
            "model_ref": {"type": MODEL_REF_TYPE, "name": self.model_name},
            "started_at": self.started_at,
            "completed_at": self.completed_at,
            "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 3),
            "latency_ttft_ms": None if self.latency_ttft_ms is None else round(self.latency_ttft_ms, 3),
            "status_code": self.status_code,
            "client_session_id": self.client_session_id,
            "client_assistant_message_id": self.client_assistant_message_id,
            "client_agent_id": self.client_agent_id,
            "client_parent_agent_id": self.client_parent_agent_id,
            "upstream_attempted": self.upstream_attempted,
            "response_source": self.response_source,
            "upstream_status_code": self.upstream_status_code,
            "local_response_reason": self.local_response_reason,
        }
        fields.update(self._request_fields())
        self.note_json_retry(fields.get("request"))
        fields.update(self._response_fields())
        fields["added_request_fields"] = self.added_request_fields
        fields["retry_of"] = self.retry_of
        # Evidence keys appear only when there is something to say; the execution outcome always.
        return {key: value for key, value in fields.items() if value is not None or key not in _OMITTED_WHEN_NONE}

    def _read_request_headers(self, headers: Headers) -> None:
        session_header, message_header = self.correlation_headers
        fields = self.request_fields if self.request_fields is not None else first_values(headers)
        # Looked for only when sent (most calls carry neither): `single_value` scans the head.
        self.client_session_id = _first_sent(headers, fields, (session_header, *HARNESS_SESSION_HEADERS))
        self.client_agent_id = _first_sent(headers, fields, HARNESS_AGENT_HEADERS)
        self.client_parent_agent_id = _first_sent(headers, fields, HARNESS_PARENT_AGENT_HEADERS)
        self.client_assistant_message_id = (single_value(headers, message_header, fields)
                                            if _field_name(message_header) in fields else None)
        encoding = fields.get(b"content-encoding")
        self.request_encoding = encoding.decode("latin-1") if encoding is not None else None
        self.request_headers = self.request_fields = None

    def _request_fields(self) -> dict[str, Any]:
        if self.parsed_request is not None:
            return {"request": self.parsed_request}
        body = self.request_body
        if self.request_encoding is not None:
            try:
                body = make_decoder(self.request_encoding)(body)
            except Exception:
                pass  # Kept as it came: `request_raw` says what it was.
        parsed = parse_json_object(body)
        if parsed is not None:
            return {"request": parsed}
        if not decodable(self.request_encoding):
            return {"request": None, "request_raw": as_evidence(self.request_encoding, body)}
        return {"request": None, "request_raw": body.decode("utf-8", "replace")}

    def _response_fields(self) -> dict[str, Any]:
        failure = self.failure
        fields: dict[str, Any] = {"response": self.local_body, "error_category": self.category_override}
        if self.tap is not None and self.status_code is not None and self.response_source == "upstream":
            tap = self.tap
            if self.raw_stream == "on-failure" and isinstance(tap, StreamTap):
                # The raw text is made (a copy of the stream) only for a stream that failed.
                outcome = tap.finish(self.status_code, with_raw=False)
                fields["response"] = outcome.response
                fields["response_raw"] = None if _reassembled_whole(outcome) else tap.raw_text()
            else:
                outcome = tap.finish(self.status_code)
                fields["response"] = outcome.response
                fields["response_raw"] = outcome.response_raw
            fields["stream_truncated"] = outcome.stream_truncated
            fields["error_category"] = self.category_override or outcome.error_category
            if fields["error_category"] is None and is_aborted_reply(outcome.response):
                fields["error_category"] = "aborted"
            if failure is None and outcome.parse_failure is not None:
                failure = Failure("capture", "capture_parse_error", outcome.parse_failure)
        if failure is not None:
            fields["failure"] = failure.as_dict()
        return fields


def _first_sent(headers: Headers, fields: dict[bytes, bytes], names: tuple[str, ...]) -> str | None:
    """The value of the first of ``names`` the request carries (the one-distinct-value rule:
    `single_value`), else None. Looked for only when sent: most calls carry none of them."""
    for name in names:
        if _field_name(name) in fields:
            return single_value(headers, name, fields)
    return None


@functools.lru_cache(maxsize=64)  # A few constant names, looked for on every captured call.
def _field_name(name: str) -> bytes:
    """A header's name as `ServerRequest.fields` keys it."""
    return name.lower().encode("latin-1")


def _reassembled_whole(outcome: TapOutcome) -> bool:
    """The stream ended and was rebuilt without a fault: ``response`` says all ``response_raw`` would."""
    return (outcome.response is not None and outcome.parse_failure is None and outcome.stream_truncated is False
            and outcome.error_category not in ("capture_parse_error", "stream_truncated"))

