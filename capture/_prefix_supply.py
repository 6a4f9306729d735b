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


#: Responses items the model wrote: the parent's turn, sent back (its reasoning, text and calls).
_MODEL_AUTHORED_TYPES = frozenset({"reasoning", "function_call", "custom_tool_call"})
#: Roles a Responses input message may have after the parent's turn (a new turn's own).
_INPUT_ROLES = frozenset({"user", "system", "developer"})


def responses_render_request(request: dict[str, Any]) -> Optional[dict[str, Any]]:
    """A Responses request as the chat request its renders are asked as (vLLM renders a Responses
    request by building chat messages from its items, ``responses/utils.py``
    ``construct_input_messages``, and ``/tokenize`` renders chat messages), or None when it cannot
    have a prefix: no item the model wrote, ``previous_response_id`` (vLLM adds the stored turn),
    the agent's own ``kv_transfer_params``, a non-function tool, or a new turn holding anything but
    text messages and function-call outputs.

    The parent's turn -- the last run of items the model wrote -- becomes one assistant message
    (which `render_requests` replaces by its stand-ins); what comes before it is rendered the same
    in all three renders, so only the new turn's items must be what vLLM builds, and for text
    messages and function-call outputs they are (a message as itself, an output as a tool message)."""
    items = request.get("input")
    if type(items) is not list or "kv_transfer_params" in request or request.get("previous_response_id") \
            or request.get("background"):
        return None
    last = None
    for index, item in enumerate(items):
        if type(item) is not dict:
            return None
        if _model_authored(item):
            last = index
    if last is None:
        return None
    first = last
    while first > 0 and _model_authored(items[first - 1]):
        first -= 1
    tools = _chat_tools(request.get("tools"))
    after = _input_messages(items[last + 1:])
    if tools is None or after is None:
        return None
    before = [message for message in (_loose_message(item) for item in items[:first]) if message is not None]
    instructions = request.get("instructions")
    system = [{"role": "system", "content": instructions}] if isinstance(instructions, str) and instructions else []
    chat: dict[str, Any] = {"messages": [*system, *before, {"role": "assistant", "content": ""}, *after]}
    if tools:
        chat["tools"] = tools
    for name in ("model", "chat_template_kwargs"):
        if name in request:
            chat[name] = request[name]
    return chat


def _model_authored(item: dict[str, Any]) -> bool:
    return item.get("type") in _MODEL_AUTHORED_TYPES or (item.get("role") == "assistant"
                                                         and item.get("type") in (None, "message"))


def _text_of(content: Any) -> Optional[str]:
    """A message's text: a string, or its text parts joined; None when a part is not text."""
    if isinstance(content, str):
        return content
    if type(content) is not list:
        return None
    texts = []
    for part in content:
        if type(part) is not dict or part.get("type") not in ("input_text", "output_text", "text") \
                or not isinstance(part.get("text"), str):
            return None
        texts.append(part["text"])
    return "".join(texts)


def _input_messages(items: list[Any]) -> Optional[list[dict[str, Any]]]:
    """A new turn's items as vLLM's chat messages, or None when one is not plain."""
    messages = []
    for item in items:
        if item.get("type") == "function_call_output" and isinstance(item.get("output"), str):
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": item["output"]})
            continue
        text = _text_of(item.get("content"))
        if item.get("type") not in (None, "message") or item.get("role") not in _INPUT_ROLES or text is None:
            return None
        messages.append({"role": item["role"], "content": text})
    return messages


def _loose_message(item: dict[str, Any]) -> Optional[dict[str, Any]]:
    """An item before the parent's turn, near enough: all three renders share it."""
    if item.get("type") == "function_call_output":
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": str(item.get("output") or "")}
    if item.get("type") in _MODEL_AUTHORED_TYPES:
        return {"role": "assistant", "content": ""}
    role = item.get("role")
    return {"role": role, "content": _text_of(item.get("content")) or ""} if isinstance(role, str) else None


def _chat_tools(tools: Any) -> Optional[list[dict[str, Any]]]:
    """Responses function tools as chat tools (what the template renders), None for other tools."""
    if tools is None:
        return []
    if type(tools) is not list:
        return None
    found = []
    for tool in tools:
        if type(tool) is not dict or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
            return None
        found.append({"type": "function", "function": {
            key: tool[key] for key in ("name", "description", "parameters") if key in tool}})
    return found


def reported_prompt_ids(response: Any) -> Any:
    """The prompt ids a reply reports: chat's ``prompt_token_ids``, or vLLM's Responses
    ``input_messages[*].tokens`` (``enable_response_messages``) joined."""
    if type(response) is not dict:
        return None
    if response.get("prompt_token_ids") is not None:
        return response["prompt_token_ids"]
    messages = response.get("input_messages")
    if type(messages) is not list or not messages:
        return None
    ids: list[Any] = []
    for message in messages:
        tokens = message.get("tokens") if type(message) is dict else None
        if type(tokens) is not list:
            return None
        ids += tokens
    return ids


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
