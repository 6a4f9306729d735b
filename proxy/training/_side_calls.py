"""Side calls: model calls of a rollout that are not the policy's turns (docs/tokens.md, "Side calls";
DESIGN section 17). They are captured whole and marked, never trained on and never dropped.

A call is a side call when:

- ``other_model``: it asks for another model than the rollout's policy model: ``--policy-model``,
  else the model of the rollout's first call this sidecar process saw (a rollout spread over
  several sidecars or workers should name ``--policy-model``);
- ``title``: a harness asks for a title for its conversation (Claude Code 2.1 names each session
  by a call with no tools whose system prompt asks for "a concise, sentence-case title" and whose
  ``output_config.format`` is JSON of one ``title``, as recorded through the harness tier; older
  versions asked whether the message starts a new topic, ``isNewTopic``);
- ``quota``: a harness probes its quota (Claude Code sends ``"quota"`` with ``max_tokens: 1``).

The line says so (``side_call: {"reason": ...}``); the token capture mode gives a side call no
intent and no training-token entry (so no token-file chain, trajectory or consumer item has it);
``mcc_side_calls_total{reason}`` counts them.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Optional

from prometheus_client import Counter

from ..call import CallHooks

if TYPE_CHECKING:
    from ..call import CallExchange, SidecarMetrics

#: The rollouts whose first model is remembered (the oldest forgotten first).
_REMEMBERED = 100_000
#: What a harness's title call asks for, in its system prompt (lower case): Claude Code's topic
#: and title prompts.
_TITLE_MARKERS = ("isnewtopic", "a concise, sentence-case title", "write a 5-10 word title",
                  "summarize this coding conversation in under 50 characters")
#: The roles whose message is a chat request's system prompt.
_SYSTEM_ROLES = ("system", "developer")
#: A harness's quota probe: this one user message and at most this many tokens.
_QUOTA_TEXT, _QUOTA_MAX_TOKENS = "quota", 1


class SideCalls:
    """The rule of one sidecar process, and its count."""

    def __init__(self, policy_model: Optional[str], metrics: "SidecarMetrics") -> None:
        self.policy_model = policy_model
        self._first_model: OrderedDict[str, str] = OrderedDict()
        self.counted = Counter("mcc_side_calls_total", "Captured calls marked side calls (not the policy's turns: "
                               "captured whole, left out of every trajectory), by reason.", ["reason"],
                               registry=metrics.registry)
        self._hooks = SideCallHooks(self)

    def reason(self, rollout_id: str, request: Any) -> Optional[str]:
        """Why the call of ``request`` (its parsed body) is a side call, or None when it is a turn."""
        if not isinstance(request, dict):
            return None
        harness = _harness_side_call(request)
        if harness is not None:
            return harness
        model = request.get("model")
        if not isinstance(model, str):
            return None
        policy = self.policy_model or self._first_model.get(rollout_id)
        if policy is None:
            self._first_model[rollout_id] = model
            if len(self._first_model) > _REMEMBERED:
                self._first_model.popitem(last=False)
            return None
        return "other_model" if model != policy else None

    def hooks(self) -> "SideCallHooks":
        """The calls' hooks: one for every call (a call's mark is its exchange's ``side_call``)."""
        return self._hooks


class SideCallHooks(CallHooks):
    """A call's mark: decided from its request when its line is made (or earlier, by the token
    capture mode, which must know before the call is dispatched), kept on the call's exchange; no
    state of its own, so one serves every call."""

    __slots__ = ("rule",)

    def __init__(self, rule: SideCalls) -> None:
        self.rule = rule

    def line_fields(self, exchange: "CallExchange", fields: dict[str, Any]) -> None:
        if exchange.side_call is None and exchange.response_source == "upstream":
            exchange.side_call = self.rule.reason(exchange.rollout_id, fields.get("request")) or ""
        if exchange.side_call:
            fields["side_call"] = {"reason": exchange.side_call}
            self.rule.counted.labels(exchange.side_call).inc()


def _harness_side_call(request: dict[str, Any]) -> Optional[str]:
    """Every captured call asks this (a JSON call's few µs are the sidecar's whole cost, docs/speed.md):
    the common answers come first and cheaply."""
    messages = request.get("messages")
    output_config = request.get("output_config")
    if output_config is not None and _asks_only_for_a_title(output_config):
        return "title"
    if request.get("max_tokens") == _QUOTA_MAX_TOKENS and isinstance(messages, list) and len(messages) == 1 \
            and _text(messages[0].get("content") if isinstance(messages[0], dict) else None).strip().lower() == _QUOTA_TEXT:
        return "quota"
    if request.get("tools"):
        return None  # A harness's title call offers no tools; its turns do (Claude Code: 25).
    system = request.get("system")
    system = _text(system) if system else ""
    texts = [system] if system else []
    if not texts and type(messages) is list:  # Chat: the system message leads.
        for message in messages[:2]:
            if type(message) is dict and message.get("role") in _SYSTEM_ROLES:
                texts.append(_text(message.get("content")))
    if not texts:
        return None
    text = " ".join(texts).lower()
    for marker in _TITLE_MARKERS:
        if marker in text:
            return "title"
    return None


def _asks_only_for_a_title(output_config: Any) -> bool:
    """Claude Code 2.1's title call asks for JSON of one ``title`` string (``output_config.format``)."""
    schema = output_config.get("format", {}).get("schema") if isinstance(output_config, dict) \
        and isinstance(output_config.get("format"), dict) else None
    return isinstance(schema, dict) and isinstance(schema.get("properties"), dict) \
        and list(schema["properties"]) == ["title"]


def _text(content: Any) -> str:
    """The text of a content value: a string, or its blocks' ``text``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(block.get("text", "") for block in content if isinstance(block, dict)
                        and isinstance(block.get("text"), str))
    return ""


__all__ = ["SideCallHooks", "SideCalls"]
