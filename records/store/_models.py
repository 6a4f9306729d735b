"""The record types (docs/records.md; field list from the seed's ``model_call_record`` API)."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple, Optional, TypeVar

from pydantic import BaseModel, ConfigDict, Field

_M = TypeVar("_M", bound=BaseModel)


class ModelServerRef(BaseModel):
    """Which model server answered: ``{"type": "responses_api_models", "name": ...}``. Frozen:
    one instance is shared by all the records that name the same server."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str = "responses_api_models"
    name: Optional[str] = None


class FailureReport(BaseModel):
    """What went wrong in one call, in one object (docs/files.md ``failure``)."""

    model_config = ConfigDict(extra="allow")

    #: request, upstream_connect, upstream_response, stream, client or capture (other writers may add more).
    stage: Optional[str] = None
    category: Optional[str] = None
    message: Optional[str] = None
    exception_type: Optional[str] = None
    retryable: Optional[bool] = None


class ModelOperationObservation(BaseModel):
    """One output item the model produced, in order; unlike ``tool_calls`` it shows server tools too.

    Frozen: an observation of what happened. Records read from capture files share the
    instances that carry no call id (``text`` at index 0, ``reasoning`` at index 0, ...).
    """

    model_config = ConfigDict(frozen=True)

    index: int
    kind: Literal["text", "reasoning", "tool_call", "server_tool_call", "refusal"]
    call_id: Optional[str] = None
    name: Optional[str] = None
    status: Optional[str] = None


class ToolRequestEvidence(NamedTuple):
    """Whether captured response evidence can establish a tool request."""

    kind: Literal["available", "omitted", "malformed", "unsuccessful"]
    call_ids: frozenset[str] = frozenset()

    def permits_link(self, native_call_id: str) -> bool:
        """May a tool result with ``native_call_id`` be linked to this call?

        available: only ids the response requested; omitted: yes, linked independently with a
        verification gap; malformed or unsuccessful: never.
        """
        if self.kind == "available":
            return native_call_id in self.call_ids
        return self.kind == "omitted"


class ModelCallRecord(BaseModel):
    """Observability record derived from one captured model-server exchange."""

    cache_creation_tokens: Optional[int] = None
    cache_hit: Optional[bool] = None
    cached_tokens: Optional[int] = None
    call_index: int
    #: Not in Gym's record: the harness's agent and its parent agent (docs/wire.md's correlation headers).
    client_agent_id: Optional[str] = None
    client_assistant_message_id: Optional[str] = None
    client_parent_agent_id: Optional[str] = None
    client_session_id: Optional[str] = None
    completed_at: Optional[float] = None
    #: Not in Gym's record: prompt tokens the call wrote to the engine's prefix cache (vLLM's
    #: ``usage.prompt_tokens_details.created_cache_tokens``).
    created_cache_tokens: Optional[int] = None
    dialect: Optional[str] = None
    #: Not in Gym's record: the engine that served the call and its version, where the reply says
    #: (read from ``system_fingerprint``: ``vllm-0.32.0-870eb8ba`` is ``vllm``, ``0.32.0``).
    engine: Optional[str] = None
    #: Not in Gym's record: the engine's per-request metrics as it wrote them (vLLM's ``metrics``,
    #: ``--enable-per-request-metrics``: queue time, time to first token, inter-token latency).
    engine_metrics: Optional[dict[str, Any]] = None
    #: Not in Gym's record: the engine's version, where the reply says (see ``engine``).
    engine_version: Optional[str] = None
    error_category: Optional[str] = None
    failure_report: FailureReport | None = None
    finish_reason: Optional[str] = None
    latency_total_ms: Optional[float] = None
    latency_ttft_ms: Optional[float] = None
    local_response_reason: Optional[str] = None
    model: Optional[str] = None
    model_call_id: Optional[str] = None
    model_operations: list[ModelOperationObservation] | None = None
    model_ref: Optional[ModelServerRef] = None
    #: Not in Gym's record: multimodal prompt tokens (``usage.prompt_tokens_details.multimodal_tokens``;
    #: the sum of vLLM's mapping by modality).
    multimodal_tokens: Optional[int] = None
    #: Not in Gym's record: vLLM's multimodal prompt tokens by modality (``{"image": 576}``), as it sent them.
    multimodal_tokens_by_modality: Optional[dict[str, int]] = None
    reasoning_content: Optional[str] = None
    request: Optional[dict[str, Any]] = None
    request_raw: Optional[str] = None
    response: Optional[dict[str, Any]] = None
    response_id: Optional[str] = None
    response_raw: Optional[str] = None
    response_source: Optional[Literal["upstream", "local"]] = None
    response_status: Optional[str] = None
    #: Not in Gym's record: why the call is a **side call** (not the policy's turn: ``other_model``,
    #: ``title``, ``quota``), captured whole and left out of every trajectory; None for a turn.
    side_call: Optional[str] = None
    started_at: Optional[float] = None
    status_code: Optional[int] = None
    #: Not in the seed's list: a 2xx stream that ended without its terminal event (docs/files.md).
    stream_truncated: Optional[bool] = None
    #: Not in Gym's record: the engine and configuration that served the call, as the reply names
    #: them (vLLM: version, parallelism and a config hash); calls of one rollout under different
    #: fingerprints were served by different engines (``mcc stats`` says so).
    system_fingerprint: Optional[str] = None
    #: Not in Gym's record: where ``tokens_in`` / ``tokens_out`` come from: ``reported`` (the
    #: reply's usage), ``counted`` (no usage -- a stream without ``include_usage`` -- so counted
    #: from the token mode's arrays: the reply's token ids, the call's training-token entry), or
    #: None (neither: the counts are None, never 0).
    token_counts: Optional[str] = None
    tokens_in: Optional[int] = None
    tokens_out: Optional[int] = None
    tokens_reasoning: Optional[int] = None
    tokens_total: Optional[int] = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    upstream_attempted: Optional[bool] = None
    upstream_status_code: Optional[int] = None


def construct_checked(model: type[_M], values: dict[str, Any], fields_set: "AllFieldsSet") -> _M:
    """An instance of ``model`` from ``values`` that our derivation has already type-checked.

    What ``model_construct`` does, without its per-field Python loop: ``values`` must name every
    field (``fields_set``, from `all_fields_set`), each with a value of its declared type (nested
    models as instances). Reading capture files builds hundreds of thousands of records, and
    validating values built one line earlier by code that checked each type would double the
    cost (issue 4's speed target). A test checks that ``model_validate`` of every record built
    this way gives the same record.
    """
    instance = model.__new__(model)
    _set_dict(instance, values)
    _set_fields_set(instance, fields_set)
    _set_extra(instance, None)
    _set_private(instance, None)
    return instance


class AllFieldsSet(set):
    """``__pydantic_fields_set__`` shared by every instance `construct_checked` builds of one model.

    Every field of those instances is set, so one set serves them all; a set of 37 names per
    record was half the memory a record added over its parsed line. Pydantic only ever adds a
    field name to it (already a member: nothing changes) or mutates a copy (``model_copy``), so
    sharing is invisible; anything else that would change it raises rather than leak between
    records, and copies are plain sets.
    """

    def add(self, name: Any) -> None:
        if name not in self:
            raise TypeError("the fields set of a record read from a capture file is shared; copy the record first")

    def _shared(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("the fields set of a record read from a capture file is shared; copy the record first")

    discard = remove = pop = clear = update = difference_update = intersection_update = _shared
    symmetric_difference_update = __ior__ = __iand__ = __isub__ = __ixor__ = _shared  # type: ignore[assignment]  # every mutator refuses: see _shared

    def __copy__(self) -> set[str]:
        return set(self)

    def __deepcopy__(self, memo: Any) -> set[str]:
        return set(self)

    def __reduce__(self) -> Any:
        return (set, (list(self),))


def all_fields_set(model: type[BaseModel]) -> AllFieldsSet:
    """The shared fields set of ``model`` for `construct_checked`."""
    return AllFieldsSet(model.model_fields)


# The slot setters of `BaseModel`, looked up once: `object.__setattr__` would find them by name
# through the class's MRO on every call.
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
