"""A call runs only the phases its hooks take part in (`proxy.call.CallHooks.phases`): a feature
writes the phases it needs, and the others cost a captured call nothing -- no no-op call, no
coroutine made to return at once (docs/layout.md: the call names no feature)."""

from __future__ import annotations

import os
from typing import Any

import orjson

from proxy.call import PHASES, CallHooks, phases_of
from proxy.training import SideCallHooks, TokenHooks

from tests.scripted_upstream import json_script, sse_script
from tests.transcripts import CHAT_REQUEST, CHAT_STREAM
from tests.wire import fetch, rollout_url

CHAT = "/v1/chat/completions"
REPLY = orjson.dumps({"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}]})


class _Fields(CallHooks):
    __slots__ = ()

    def line_fields(self, exchange: Any, fields: dict[str, Any]) -> None:
        fields["seen"] = True


class _Relay(_Fields):
    __slots__ = ()

    async def before_reply_bytes(self, call: Any) -> None:
        return None


def test_a_hook_takes_part_in_the_phases_its_class_overrides():
    assert _Fields.phases == {"line_fields"}
    assert _Relay.phases == {"line_fields", "before_reply_bytes"}, "a subclass keeps its base's phases"
    assert SideCallHooks.phases == {"line_fields"}
    assert {"request_body", "upstream_head", "before_reply_bytes", "line", "line_fields"} <= TokenHooks.phases
    assert set(PHASES) == {name for name in vars(CallHooks) if callable(vars(CallHooks)[name])
                           and not name.startswith("_") and name != "prepare_line"}, "every phase is listed"
    assert phases_of(()) == frozenset()
    assert phases_of((SideCallHooks.__new__(SideCallHooks), _Relay())) == {"line_fields", "before_reply_bytes"}


async def test_a_captured_call_runs_no_phase_its_hooks_leave_out(http, upstream, start, capture_dir, monkeypatch):
    """With capture on and its default features (the side-call mark: one phase), a JSON call and a
    stream go through no other phase's no-op; the one phase still runs (the line is marked)."""
    ran: list[str] = []
    for phase in PHASES:
        noop = getattr(CallHooks, phase)

        def spy(*args: Any, _noop: Any = noop, _phase: str = phase) -> Any:
            ran.append(_phase)
            return _noop(*args)
        monkeypatch.setattr(CallHooks, phase, spy)
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    upstream.scripts[CHAT] = json_script(REPLY)
    direct = await fetch(http, "POST", upstream.url + CHAT, CHAT_REQUEST)
    assert (await fetch(http, "POST", rollout_url(sidecar.url, "p1", CHAT), CHAT_REQUEST)).body == direct.body
    upstream.scripts[CHAT] = sse_script(CHAT_STREAM)
    assert (await fetch(http, "POST", rollout_url(sidecar.url, "p1", CHAT), CHAT_REQUEST)).body == CHAT_STREAM
    quota = orjson.dumps({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]})
    upstream.scripts[CHAT] = json_script(REPLY)
    assert (await fetch(http, "POST", rollout_url(sidecar.url, "p1", CHAT), quota)).status == 200
    assert ran == [], "a phase no hook takes part in was run"
    with open(os.path.join(capture_dir, "p1.capture.jsonl"), "rb") as handle:
        lines = [orjson.loads(line) for line in handle.read().splitlines()]
    assert [line.get("side_call") for line in lines] == [None, None, {"reason": "quota"}], "the one phase ran"
