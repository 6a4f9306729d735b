"""docs/records.md, generated from the models: ``python -m records._reference > docs/records.md``
(``make docs``); `tests/project/test_docs.py` checks the page is what this prints.

Every field of what readers get -- `ModelCallRecord`, `TokenRecord`, a trajectory
(`TrajectoryBuild`, `Trajectory`, `CallSpan`), an end (`RolloutEnd`) and the hand-off's items
(`FinishedRollout`, `FinishedGroup`, `Lease`) -- with its type, and its meaning from the comment
that stands above it in the code (or the class's own words).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import typing
from typing import Any

from pydantic import BaseModel

from .training import FinishedGroup, FinishedRollout, Lease
from .store import ModelCallRecord
from .contract import RolloutEnd, TokenRecord
from .training import CallLink, CallSpan, Trajectory, TrajectoryBuild

#: What each table documents, in order, and where its values come from.
SECTIONS: tuple[tuple[type, str], ...] = (
    (ModelCallRecord, "One call, from its capture line (`records.read_model_call_records`, `CaptureStore`): "
                      "NeMo Gym 0.7.0's record, its names kept, and ours beside them."),
    (TokenRecord, "One call's (one choice's) training arrays (`records.read_token_records`, "
                  "`records.iter_token_records`), with its link to its parent call."),
    (TrajectoryBuild, "A rollout's chains of calls as token sequences (`records.trajectories`)."),
    (Trajectory, "One chain of a `TrajectoryBuild`."),
    (CallSpan, "Where one call's generated tokens stand in a `Trajectory`."),
    (CallLink, "One call's verdict in its rollout's build (`TrajectoryBuild.links`): the one every reader gives."),
    (RolloutEnd, "A rollout's end (`records.read_rollout_end`; `POST /-/rollouts/<id>/end`)."),
    (FinishedRollout, "An ended rollout handed to a consumer (`records.Consumer.take`)."),
    (FinishedGroup, "A group handed out as one item (`Consumer.take(..., group_size=G)`)."),
    (Lease, "An item's lease."),
)

#: One quantity, one name per place it appears: the capture line, the record, the Parquet column.
NAMES_ACROSS = (
    ("total latency (ms)", "`latency_ms`", "`latency_total_ms`", "`latency_ms`"),
    ("time to first token (ms)", "`latency_ttft_ms`", "`latency_ttft_ms`", "`ttft_ms`"),
    ("prompt tokens, cache included", "`response.usage` (its dialect's name)", "`tokens_in`", "`tokens_in`"),
    ("generated tokens", "`response.usage` (its dialect's name)", "`tokens_out`", "`tokens_out`"),
    ("where the counts come from", "-", "`token_counts`", "`token_counts`"),
    ("HTTP status the agent got", "`status_code`", "`status_code`", "`status_code`"),
    ("when the call began / ended", "`started_at` / `completed_at` (Unix s)", "`started_at` / `completed_at`",
     "`started_at` / `completed_at` (UTC timestamps)"),
)


#: Meanings of the fields whose code carries no comment of their own (NeMo Gym's record's, mostly),
#: with where each value comes from.
MEANINGS: dict[str, dict[str, str]] = {
    "ModelCallRecord": {
        "cache_creation_tokens": "Prompt tokens written to the provider's cache (Anthropic `cache_creation_input_tokens`).",
        "cache_hit": "Whether any prompt token came from the cache (`cached_tokens > 0`); None when not reported.",
        "cached_tokens": "Prompt tokens served from the cache (OpenAI `*_tokens_details.cached_tokens`, Anthropic "
                         "`cache_read_input_tokens`).",
        "call_index": "The line's position in `<rollout_id>.capture.jsonl` (0-based, append order; an unreadable "
                      "line keeps its place).",
        "client_assistant_message_id": "Not in Gym's record: the harness's assistant message id header, if sent.",
        "client_parent_agent_id": "Not in Gym's record: the harness's parent agent (a subagent's caller), if sent.",
        "client_session_id": "Not in Gym's record: the harness's session id header (`--session-id-header`), if sent.",
        "completed_at": "When the reply ended (Unix seconds): its last byte relayed, or the call failed.",
        "dialect": "`responses`, `chat`, `completions` or `messages`: the API the call used.",
        "error_category": "Why the call failed, in one word (`upstream_error`, `client_error`, `timeout`, "
                          "`connection`, `stream_truncated`, ...), None for a success.",
        "failure_report": "What went wrong, structured (kind, message, where), for a failed call.",
        "finish_reason": "Why generation stopped: Chat's `choices[0].finish_reason`, Anthropic's `stop_reason`, "
                         "Responses' `incomplete_details.reason`.",
        "latency_total_ms": "The call's whole time at the sidecar, request to last byte (the line's `latency_ms`).",
        "latency_ttft_ms": "Time to the first content byte of the reply (ms).",
        "local_response_reason": "Why the sidecar answered itself (`rollout_ended`, `body_too_large`, "
                                 "`upstream_unreachable`, ...), for a local reply.",
        "model": "The model that answered (the reply's `model`, else the request's).",
        "model_call_id": "The call's id (unique; the line's `model_call_id`).",
        "model_operations": "The reply's operations (tool calls, outputs) as Gym observes them.",
        "model_ref": "Which model server answered (name, URL), as the sidecar knows it.",
        "reasoning_content": "The reply's reasoning text, where the dialect carries one.",
        "request": "The request body as the agent sent it (JSON).",
        "request_raw": "The request body as text, when it was not JSON.",
        "response": "The reply: JSON as received, or a stream rebuilt into its JSON shape.",
        "response_id": "The reply's `id`.",
        "response_raw": "A stream's SSE text as received (with `--capture-raw-stream on-failure`: only for a stream "
                        "that failed).",
        "response_source": "`upstream` (the model answered) or `local` (the sidecar did).",
        "response_status": "A Responses reply's `status` (`completed`, `incomplete`, `failed`).",
        "started_at": "When the request arrived (Unix seconds).",
        "status_code": "The HTTP status the agent received.",
        "tokens_in": "The whole prompt, cached tokens counted once (`prompt_tokens`, or `input_tokens` plus "
                     "Anthropic's cache fields); see `token_counts`.",
        "tokens_out": "Generated tokens (`completion_tokens` / `output_tokens`); see `token_counts`.",
        "tokens_reasoning": "Reasoning tokens, where reported (vLLM does not: None, never 0).",
        "stream_truncated": "Not in Gym's record: a 2xx stream that ended without its terminal event (cut).",
        "tokens_total": "`total_tokens`, else `tokens_in + tokens_out`.",
        "tool_calls": "The reply's tool calls, each `{name, arguments, id}` as the dialect gives them.",
        "upstream_attempted": "Whether the request reached the model server at all.",
        "upstream_status_code": "The model server's own status (differs from `status_code` when the sidecar "
                                "answered instead).",
    },
    "TokenRecord": {
        "rollout_id": "The rollout.", "model_call_id": "The call (its record's `model_call_id`).",
        "call_index": "The call's line position (its record's `call_index`).",
        "choice_index": "Which choice of the reply (n > 1); 0 otherwise.",
        "model": "The model that generated the tokens.",
        "prompt_token_ids": "The whole prompt's token ids as the engine saw them.",
        "generation_token_ids": "The generated token ids.",
        "generation_log_probs": "The sampled tokens' log probabilities, one per generated id.",
        "finish_reason": "Why generation stopped.",
        "weight_version_source": "Where `weight_versions` come from: `engine` (the server said) or `declared` "
                                 "(`POST /-/weight-version`).",
    },
    "TrajectoryBuild": {
        "rollout_id": "The rollout.", "chains": "Its chains of calls, the main one first.",
        "masked": "True when the rollout must not be trained on as is (`mask_reason` says why).",
        "mask_reason": "Why it is masked (a call without its entry, a drifted prompt, ...), else None.",
        "notes": "What the build left out, counted (Gym's metric names).",
        "main": "The main chain (the first), or None.",
    },
    "CallLink": {"model_call_id": "The call (its token file entry's id)."},
    "Trajectory": {
        "chain_id": "The chain's id (its first call's).", "token_ids": "Prompt and generated ids, one sequence.",
        "loss_mask": "1 on generated tokens (trained on), 0 on prompt tokens.",
        "logprobs": "The sampling log probability of each generated token; None on prompt tokens.",
        "calls": "Where each call's generated tokens stand in `token_ids`.",
    },
    "CallSpan": {"model_call_id": "The call.", "start": "First index of its generated tokens in the chain.",
                 "end": "One past the last."},
    "RolloutEnd": {"rollout_id": "The rollout.", "ended_at": "When the end was written (UTC Unix seconds).",
                   "outcome": "The JSON object the runner gave (reward, metrics), or None.",
                   "group": "The group key given at the end, or None.",
                   "group_size": "The group's size declared at the end, or None."},
    "FinishedRollout": {"rollout_id": "The rollout.", "ended_at": "When it ended (its `RolloutEnd`'s).",
                        "outcome": "Its end's outcome.", "group": "Its end's group key.",
                        "lease": "The lease it was handed out under (epoch, expiry).",
                        "stale": "Whether `staleness` is beyond `take`'s `max_staleness`."},
    "FinishedGroup": {"group": "The group's key.", "rollouts": "Its members (`FinishedRollout`), oldest end first.",
                      "partial": "Handed out short of its size after the straggler bound.",
                      "missing": "The members it lacks (Gym ids), when known.",
                      "lease": "The group's lease: its members are leased and acknowledged together.",
                      "item": "What the lease is of (the group's item name)."},
    "Lease": {"epoch": "The claim's slot in the item's log: a later claim is a later epoch.",
              "expires_at": "When the lease runs out (Unix seconds) unless extended or acknowledged."},
}


def field_comments(cls: type) -> dict[str, str]:
    """Each field's ``#:`` comment (the lines right above it), joined."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in source.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*:", stripped)
        if match and pending:
            comments[match.group(1)] = " ".join(pending)
        if stripped and not stripped.startswith("#"):
            pending = []
    return comments


def fields_of(cls: type) -> list[tuple[str, str]]:
    """(name, type) of a model's or a dataclass's public fields, and its public properties."""
    hints = typing.get_type_hints(cls)
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        names = list(cls.model_fields)
    else:
        names = [field.name for field in dataclasses.fields(cls) if field.repr]  # type: ignore[arg-type]  # a dataclass here (the models are taken above)
    found = [(name, _type_name(hints.get(name, Any))) for name in names if not name.startswith("_")]
    for name, member in inspect.getmembers(cls):
        if isinstance(member, property) and not name.startswith("_") and name not in dict(found):
            returned = typing.get_type_hints(member.fget).get("return", Any) if member.fget else Any
            found.append((name, _type_name(returned)))
    return found


def _type_name(hint: Any) -> str:
    text = str(hint).replace("typing.", "").replace("NoneType", "None")
    text = re.sub(r"<class '([^']+)'>", lambda match: match.group(1).rsplit(".", 1)[-1], text)
    return re.sub(r"\b(?:records|pydantic)\.[A-Za-z_.]*\.([A-Za-z_]+)", r"\1", text)


def meaning(cls: type, name: str, comments: dict[str, str]) -> str:
    written = MEANINGS.get(cls.__name__, {}).get(name)
    if written is not None:
        return written
    if name in comments:
        return _for_users(comments[name])
    member = getattr(cls, name, None)
    if isinstance(member, property) and member.__doc__:
        return _for_users(" ".join(member.__doc__.split()))
    return ""


def _for_users(text: str) -> str:
    """A code comment as the docs say it: without the citations of documents a user's clone has not."""
    text = re.sub(r"\s*\((?:[^()]*\b(?:DESIGN|issue)\b[^()]*)\)", "", text)
    return re.sub(r"\s*\b(?:DESIGN\s*§\s*\d+(?:'s)?|issue \d+)\b", "", text).strip()


#: A table cell's ``|``, escaped.
_PIPE = "\\|"


def render() -> str:
    out = ["# The records' fields", "",
           "<!-- Generated from the models by `python -m records._reference` (make docs); "
           "tests/project/test_docs.py checks it. -->", "",
           "What the `records` package hands a reader, field by field. A count nobody reported is `None`, "
           "never 0; fields marked \"Not in Gym's record\" are ours, beside NeMo Gym 0.7.0's.", "",
           "## One name per quantity", "",
           "| quantity | capture line | record | Parquet column |", "|---|---|---|---|"]
    out += [f"| {quantity} | {line} | {record} | {column} |" for quantity, line, record, column in NAMES_ACROSS]
    for cls, what in SECTIONS:
        comments = field_comments(cls)
        out += ["", f"## `{cls.__name__}`", "", what, "", "| field | type | meaning |", "|---|---|---|"]
        for name, type_name in fields_of(cls):
            said = meaning(cls, name, comments).replace("|", _PIPE)
            out.append(f"| `{name}` | `{type_name.replace('|', _PIPE)}` | {said} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
