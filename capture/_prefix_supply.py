"""Prefix supply, sans-io (docs/tokens.md, issue 32): the prompt ids that make a chat turn extend the
call it continues exactly, from the upstream's own renderer.

Why: a chat template re-renders the conversation from text each turn, and the text of a
generation does not always tokenize back to the ids that were sampled (reasoning dropped, a
different merge at a boundary, a tool call re-serialised): the next prompt then departs from
what was trained on. vLLM 0.32 takes the prompt as ids instead of rendering the messages when a
chat request carries ``kv_transfer_params.prompt_token_ids`` (``renderers/online_renderer.py``,
``_reused_prompt_token_ids``: the messages still drive tool parsing; ignored with ``echo`` and
for non-text content). The supplied prompt is::

    parent's prompt ids + parent's generation ids   (the parent's whole sequence, as sampled)
    + the template's end of an assistant turn that the generation did not already end with
    + the new turn's ids (what the template renders after that assistant turn)

The two pieces the template owns come from the upstream's renderer (``/tokenize`` with
``messages``), never from a tokenizer of ours, on three renders of the conversation with the
parent's assistant turn replaced by a one-letter stand-in: ``head_a`` and ``head_b`` end with
that turn (contents ``A`` and ``B``: their common suffix is the turn's end), ``tail_a`` is the
whole request (the new turn follows ``head_a`` in it). A template that does not render
``head_a`` as a prefix of ``tail_a`` gets no supply (the call goes as the agent sent it, and its
drift is recorded).
"""

from __future__ import annotations

from typing import Any, Optional

#: Request fields of a chat call that change how vLLM renders it, passed to its ``/tokenize``.
_RENDER_FIELDS = ("model", "tools", "chat_template", "chat_template_kwargs", "add_special_tokens",
                  "mm_processor_kwargs")
_STAND_INS = ("A", "B")


class PrefixRenders:
    """The three render requests of one chat call (`render_requests`), and the splice."""

    def __init__(self, request: dict[str, Any], turn: int) -> None:
        self.request = request
        #: The index of the parent's assistant turn in the request's messages (the last one).
        self.turn = turn

    @property
    def resumes_in_place(self) -> bool:
        """The parent's turn is the last message, continued (``continue_final_message``): the new
        prompt is the parent's sequence itself (a call resumed after an abort)."""
        return self.turn == len(self.request["messages"]) - 1 and self.request.get("continue_final_message") is True

    def bodies(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """``/tokenize`` bodies: head_a, head_b, tail_a."""
        messages = self.request["messages"]
        base = {name: self.request[name] for name in _RENDER_FIELDS if name in self.request}
        before, after = messages[:self.turn], messages[self.turn + 1:]
        heads = [{**base, "messages": [*before, {"role": "assistant", "content": letter}],
                  "add_generation_prompt": False, "continue_final_message": False} for letter in _STAND_INS]
        tail = {**base, "messages": [*before, {"role": "assistant", "content": _STAND_INS[0]}, *after],
                "add_generation_prompt": self.request.get("add_generation_prompt", True),
                "continue_final_message": self.request.get("continue_final_message", False)}
        return heads[0], heads[1], tail

    def prompt(self, parent_sequence: list[int], head_a: list[int], head_b: list[int],
               tail_a: list[int]) -> tuple[Optional[list[int]], str]:
        """(the ids to send, "") or (None, why not)."""
        if self.resumes_in_place:
            return list(parent_sequence), ""
        if tail_a[:len(head_a)] != head_a:
            return None, "template_not_prefix_stable"
        turn_end = _common_suffix(head_a, head_b)
        # The generation may already end with the turn's first tokens (vLLM keeps the EOS it stopped on).
        done = next((size for size in range(len(turn_end), 0, -1)
                     if parent_sequence[-size:] == turn_end[:size]), 0) if parent_sequence else 0
        return [*parent_sequence, *turn_end[done:], *tail_a[len(head_a):]], ""


def render_requests(request: dict[str, Any]) -> Optional[PrefixRenders]:
    """The renders a chat request needs for prefix supply, or None when it cannot have one: no
    assistant turn, messages that are not plain, or the agent's own ``kv_transfer_params``."""
    messages = request.get("messages")
    if type(messages) is not list or not messages or "kv_transfer_params" in request or request.get("echo"):
        return None
    turn = None
    for index, message in enumerate(messages):
        if type(message) is not dict:
            return None
        if message.get("role") == "assistant":
            turn = index
    return PrefixRenders(request, turn) if turn is not None else None


def tokenized_ids(body: Any) -> Optional[list[int]]:
    """The ids of a ``/tokenize`` reply (``{"count", "max_model_len", "tokens"}``), else None."""
    tokens = body.get("tokens") if type(body) is dict else None
    if type(tokens) is not list or not all(type(token) is int for token in tokens):
        return None
    return tokens


def proves_prefix(prompt_token_ids: Any, prefix: list[int]) -> bool:
    """The prompt ids the upstream reports begin with the supplied prefix (Gym's proof)."""
    return type(prompt_token_ids) is list and len(prompt_token_ids) >= len(prefix) \
        and prompt_token_ids[:len(prefix)] == prefix


def _common_suffix(left: list[int], right: list[int]) -> list[int]:
    size = 0
    while size < min(len(left), len(right)) and left[-1 - size] == right[-1 - size]:
        size += 1
    return left[len(left) - size:]
