"""The token capture mode's reply half, sans-io (docs/tokens.md): cut from a reply what the added fields
put there, so the agent gets the bytes of a direct call with its own request.

Cutting is by byte spans, never by re-serialising: a value is replaced by what vLLM writes when the
field is not asked for (``null``, ``[]``), and an event that exists only because of the added
fields is dropped whole. Streams are framed by `SSEParser.feed_blocks` -- the reader the capture
uses -- so any framing the SSE rules allow is cut the same way; a data value spread over several
``data:`` lines is cut across them.

What vLLM 0.32.0 writes, read from its source and checked on recordings of a real vLLM
(`tests/conformance/test_vllm_recordings.py`):

- chat (``chat_completion/serving.py``): top-level ``prompt_token_ids``, each choice's ``token_ids``
  and ``logprobs``. A token the parser holds back (``delta_message is None``: a tool-call marker, a
  reasoning tag) gets a chunk of its own (``"delta":{}``, no finish reason; with usage under
  ``continuous_usage_stats``) only when ``logprobs`` or ``return_token_ids`` is asked: dropped when
  the agent asked for neither. One parser writes such a chunk itself: Mistral's, for pre-v11
  tokenizers, once its ``[TOOL_CALLS]`` JSON is closed (``parser/mistral.py``, ``ALL_TOOLS_COMPLETE``)
  sends ``DeltaMessage()`` for every later token, asked or not; those chunks are kept.
- completions: each choice's ``logprobs``, ``prompt_token_ids`` and ``token_ids``.
- Responses: logprobs on ``output_text`` parts (a list, else ``null``) and text deltas (a list,
  else ``[]``), the sampler's ``top_logprobs`` echoed (else ``null``); ``input_messages`` and
  ``output_messages`` (else ``null``).

What SGLang writes (``entrypoints/openai/serving_chat.py``, ``sse_utils.py``): each choice's
``logprobs`` (else ``null``), and the ids in a response-level ``sglext`` object that SGLang writes
only when something is in it: a JSON reply's ``sglext`` member is cut whole (with its comma), a
stream's last ``choices: []`` chunk that holds it is dropped.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, Callable, Optional

import orjson

from ._json_spans import Cut, Span, found_spans, spliced, walked_spans
from ._sse import EventBlock, SSEParser
from ._token_request import SGLEXT_ID_FIELDS, vllm_bool

_DROP = object()
_UNPARSED = object()
_LOGPROBS, _LOGPROBS_AFTER_COMMA, _LOGPROBS_OBJECT = b'"logprobs":', b',"logprobs":', b'"logprobs":{'
_TOKEN_IDS, _TOKEN_IDS_AFTER_COMMA, _TOKEN_IDS_LIST = b'"token_ids":', b',"token_ids":', b'"token_ids":['
_TOOL_CALLS = "[TOOL_CALLS]"
#: A cut whose replacement is this removes the member, key and comma with it (SGLang's ``sglext``).
REMOVE_MEMBER = ""
_TOOL_CALLS_BYTES = _TOOL_CALLS.encode()


class AddedFieldCutter:
    """Cut from one reply what the fields in ``added`` put there (``request`` is the agent's own).

    `cut_block` / `cut_part` cut one framed event (the tap frames, and parses the data once for
    the capture and the cut); `feed` / `close` frame a stream themselves; `cut_body` cuts a whole
    JSON body. An event or body that cannot be read is passed on as it came: cutting never guesses.
    """

    def __init__(self, dialect: str, added: dict[str, Any], request: dict[str, Any]) -> None:
        self.dialect = dialect
        self.added = added
        #: The JSON this cutter wrote of a value of the current event, by ``id(value)``: the tap's
        #: fold reuses it for the per-token lists (`Reassembler.written`); cleared per event.
        self.written: dict[int, bytes] = {}
        #: Events dropped whole, values cut, and events with token data that could not be cut.
        self.dropped_events = 0
        self.cut_values = 0
        self.uncut_events = 0
        asked_token_data = vllm_bool(request.get("logprobs")) or vllm_bool(request.get("return_token_ids"))
        self._cut_logprobs = "logprobs" in added
        self._cut_token_ids = "return_token_ids" in added
        #: vLLM 0.33 writes ``weight_versions`` on a choice's last chunk only (issue 32).
        self._cut_weight_versions = "return_weight_versions" in added
        self._drop_empty_chunks = dialect == "chat" and not asked_token_data
        #: SGLang: the ``sglext`` members the added fields put there (`SGLEXT_ID_FIELDS`).
        self._sglext = frozenset(member for name, member in SGLEXT_ID_FIELDS.items() if name in added)
        #: Per choice index: the Mistral tool-call JSON followed through the token texts.
        self._tool_texts: dict[Any, _ToolCallJson] = {}
        self._framer: Optional[SSEParser] = None
        #: The last event was dropped (a stray LF that ends it goes with it).
        self._dropped_last = False
        # The class's functions, not bound methods: a bound method kept on its own instance is a
        # cycle per call, left to the garbage collector (issue 34).
        self._rules: Callable[[AddedFieldCutter, str, dict[str, Any]], list[Cut]] = {
            "chat": AddedFieldCutter._chat_cuts, "completions": AddedFieldCutter._completions_cuts,
            "responses": AddedFieldCutter._responses_cuts,
        }.get(dialect, _no_cuts)

    @property
    def cuts_logprobs(self) -> bool:
        """The mode added ``logprobs``: the agent's reply (and line) carries none."""
        return self._cut_logprobs

    # -- streams ---------------------------------------------------------------------------

    def feed(self, chunk: bytes) -> bytes:
        """The agent's bytes for the events ``chunk`` completed (an event waits for its end)."""
        if self._framer is None:
            self._framer = SSEParser()
        out = [self.cut_block(block) for block in self._framer.feed_blocks(chunk)]
        self.written.clear()  # Nobody folds these payloads: an id is reused once its object is gone.
        return b"".join(out)

    def close(self) -> bytes:
        """End of stream: what is left of an unterminated last event, cut as if it had ended."""
        block = self._framer.close_blocks() if self._framer is not None else None
        return self.cut_block(block) if block is not None else b""

    def cut_block(self, block: EventBlock, payload: Any = _UNPARSED) -> bytes:
        """One framed block (`SSEParser.feed_blocks`) cut; ``payload``: its data parsed, if done."""
        if block.ends_previous:  # Goes where the block it ends went.
            return b"" if self._dropped_last else block.raw
        data = block.data
        self._dropped_last = False
        if data is None:
            return block.raw
        if payload is _UNPARSED:
            payload = _loads(data)
        if type(payload) is not dict:
            return block.raw
        spans = self._spans(data, block.event_type, payload)
        if spans is _DROP:
            self._dropped_last = True
            return b""
        if not spans:
            return block.raw
        in_block = _spans_in_block(spans, block.data_spans, block.raw)
        if in_block is None:
            self.uncut_events += 1
            return block.raw
        return spliced(block.raw, in_block)

    def cut_part(self, part: bytes, event_type: str, data: bytes, payload: Any) -> bytes:
        """One whole event of the plain shape (`SSEParser.feed_plain`: its lines without the blank
        line, its data -- the end of ``part`` -- and the data parsed or None), cut, with its blank line."""
        self._dropped_last = False
        if type(payload) is not dict:
            return part + b"\n\n"
        if self.dialect == "chat":
            fast = self._chat_part(part, payload)
            if fast is not None:
                return fast
        spans = self._spans(data, event_type, payload)
        if spans is _DROP:
            self._dropped_last = True
            return b""
        if not spans:
            return part + b"\n\n"
        offset = len(part) - len(data)
        if len(spans) == 1:  # One value cut (the common shapes: one or two): no sort, no list.
            ((start, end, value),) = spans
            return b"".join((part[:start + offset], value, part[end + offset:], b"\n\n"))
        if len(spans) == 2:
            (a, b, first), (c, d, second) = sorted(spans)
            return b"".join((part[:a + offset], first, part[b + offset:c + offset], second, part[d + offset:], b"\n\n"))
        return spliced(part, [(start + offset, end + offset, value) for start, end, value in spans]) + b"\n\n"

    # -- event templates (the tap's fast path, `capture._event_templates`) -------------------

    @property
    def takes_templates(self) -> bool:
        """Events may be cut by a learnt template: no Mistral tool call is being followed."""
        return not self._tool_texts

    @property
    def watches_tool_calls(self) -> bool:
        """A token text holding ``[TOOL_CALLS]`` changes what this cutter does next (it follows
        Mistral's tool call to know which empty chunks are the parser's own)."""
        return self._drop_empty_chunks

    def cut_template(self, part: bytes, event_type: str, data: bytes, payload: dict[str, Any]
                     ) -> Optional[tuple[bytes, int, bool]]:
        """`cut_part` of an event with markers in its slots, leaving this cutter as it was: the cut
        bytes, the values cut, whether the event is dropped. None when it could not be cut."""
        if self._tool_texts:
            return None
        saved = self.cut_values, self.dropped_events, self._dropped_last, self.uncut_events
        cut = self.cut_part(part, event_type, data, payload)
        outcome = cut, self.cut_values - saved[0], self.dropped_events > saved[1]
        uncut = self.uncut_events != saved[3]
        self.cut_values, self.dropped_events, self._dropped_last, self.uncut_events = saved
        self.written.clear()
        return None if uncut else outcome

    def took_template_events(self, count: int, cut_values: int, dropped: bool) -> None:
        """``count`` events were cut by a template whose event has ``cut_values`` and ``dropped``."""
        self.cut_values += cut_values * count
        if dropped:
            self.dropped_events += count
        self._dropped_last = dropped

    # -- bodies ----------------------------------------------------------------------------

    def cut_body(self, body: bytes) -> bytes:
        """A whole JSON body with the added fields' values cut (never dropped)."""
        payload = _loads(body)
        if type(payload) is not dict:
            return body
        spans = self._value_spans(body, "body", payload)
        self.written.clear()
        return spliced(body, spans) if spans else body

    def rules(self, response: dict[str, Any]) -> list[Cut]:
        """What `cut_body` replaces in a body (or a stream rebuilt as one): (path, JSON value)."""
        return self._rules(self, "body", response)

    def cut_parsed(self, response: dict[str, Any]) -> dict[str, Any]:
        """`cut_body` on a body already parsed: the same values replaced, in ``response`` itself
        (the capture writer's copy of what the agent saw, docs/tokens.md)."""
        for path, replacement in self._rules(self, "body", response):
            container: Any = response
            for step in path[:-1]:
                container = container[step]
            if replacement == REMOVE_MEMBER:
                del container[path[-1]]
            else:
                container[path[-1]] = orjson.loads(replacement)
        return response

    # -- the cutting -----------------------------------------------------------------------

    def _spans(self, data: bytes, event_type: str, payload: dict[str, Any]) -> Any:
        """An event's spans to replace ([] for none), or `_DROP` when the whole event goes."""
        if self._sglext and payload.get("choices") == [] and type(payload.get("sglext")) is dict:
            if set(payload["sglext"]) <= self._sglext:  # SGLang's ids chunk, there for the added fields only.
                self.dropped_events += 1
                return _DROP
            self.uncut_events += 1
            return []
        if self._drop_empty_chunks:
            if self._tool_texts or _TOOL_CALLS_BYTES in data:
                self._follow_tool_calls(payload)
            # Read from the parsed chunk, never from its bytes: a server or gateway may write
            # `"delta" : {}` or escape a key, and such a chunk must go all the same (a few dict
            # lookups; the one-token chunks that say something do not come here, `_chat_part`).
            if self._only_token_data(payload):
                self.dropped_events += 1
                return _DROP
        return self._value_spans(data, event_type, payload)

    def _value_spans(self, data: bytes, event_type: str, payload: dict[str, Any]) -> list[Span]:
        if self.dialect == "chat":
            fast = self._chat_token_chunk(data, payload)
            if fast is not None:
                return fast
        elif event_type == "message" and type(payload.get("type")) is str:
            event_type = payload["type"]
        cuts = self._rules(self, event_type, payload)
        if not cuts:
            return []
        spans = found_spans(data, cuts, payload)
        if spans is None:
            spans = walked_spans(data, cuts)
        if spans is not None and any(cut[1] == REMOVE_MEMBER for cut in cuts):
            spans = _with_members_removed(data, spans)
        if spans is None:
            self.uncut_events += 1
            return []
        self.cut_values += len(spans)
        return spans

    def _only_token_data(self, payload: dict[str, Any]) -> bool:
        """A chat chunk whose every choice has an empty delta and no finish reason: it exists only
        to carry a token's logprobs / ids (serving.py, ``delta_message is None``) -- unless the
        choice's Mistral tool calls are closed, when the parser sends it itself."""
        choices = payload.get("choices")
        if type(choices) is not list or not choices or payload.get("error") is not None:
            return False
        tool_texts = self._tool_texts
        for choice in choices:
            if type(choice) is not dict or choice.get("delta") != {} or choice.get("finish_reason") is not None:
                return False
            if tool_texts:
                followed = tool_texts.get(choice.get("index"))
                if followed is not None and followed.closed:
                    return False
        return True

    def _follow_tool_calls(self, payload: dict[str, Any]) -> None:
        """Feed each choice's token texts (from the logprobs the mode asked for) to its Mistral
        tool-call JSON, from the ``[TOOL_CALLS]`` token on."""
        choices = payload.get("choices")
        for choice in choices if type(choices) is list else ():
            logprobs = choice.get("logprobs") if type(choice) is dict else None
            content = logprobs.get("content") if type(logprobs) is dict else None
            if type(content) is not list:
                continue
            index = choice.get("index")
            followed = self._tool_texts.get(index)
            for entry in content:
                token = entry.get("token") if type(entry) is dict else None
                if type(token) is not str:
                    continue
                if followed is None:
                    at = token.find(_TOOL_CALLS)
                    if at < 0:
                        continue
                    followed = self._tool_texts[index] = _ToolCallJson()
                    token = token[at + len(_TOOL_CALLS):]
                followed.feed(token)

    def _chat_part(self, part: bytes, payload: dict[str, Any]) -> Optional[bytes]:
        """The hottest path: one token's chat chunk of one choice, with something to say (vLLM's
        shape, one per generated token), cut in the event's own bytes, with its blank line.
        None: anything else (a chunk that might be dropped, a Mistral tool call being followed,
        two choices, the prompt ids) takes `_spans`."""
        choices = payload.get("choices")
        if (type(choices) is not list or len(choices) != 1 or self._tool_texts or _TOOL_CALLS_BYTES in part
                or payload.get("prompt_token_ids") is not None):
            return None
        choice = choices[0]
        if type(choice) is not dict or (self._drop_empty_chunks and choice.get("delta") == {}):
            return None
        if self._cut_weight_versions and choice.get("weight_versions") is not None:
            return None  # The choice's last chunk: the general way cuts its spans too.
        written = self.written
        first = second = None
        logprobs = choice.get("logprobs") if self._cut_logprobs else None
        if logprobs is not None:
            first = _span_after_key(part, written, logprobs, _LOGPROBS, _LOGPROBS_AFTER_COMMA)
            if first is None:
                return None
        token_ids = choice.get("token_ids") if self._cut_token_ids else None
        if token_ids is not None:
            second = _span_after_key(part, written, token_ids, _TOKEN_IDS, _TOKEN_IDS_AFTER_COMMA)
            if second is None:
                return None
        if first is None or second is None:
            span = first or second
            if span is None:
                return None
            self.cut_values += 1
            return b"".join((part[:span[0]], b"null", part[span[1]:], b"\n\n"))
        if second[0] < first[0]:
            first, second = second, first
        self.cut_values += 2
        return b"".join((part[:first[0]], b"null", part[first[1]:second[0]], b"null", part[second[1]:], b"\n\n"))

    def _chat_token_chunk(self, data: bytes, payload: dict[str, Any]) -> Optional[list[Span]]:
        """The hot path: a chat chunk of one choice, as vLLM writes one per token -- its
        ``logprobs`` and ``token_ids`` values cut where the key, right after a ``,``, is followed
        by exactly the value the parse found (orjson writes vLLM's compact JSON the same way),
        and no other key of that name is in the event. None: take the general way."""
        choices = payload.get("choices")
        if type(choices) is not list or len(choices) != 1 or payload.get("prompt_token_ids") is not None \
                or (self._sglext and "sglext" in payload):
            return None
        choice = choices[0]
        if type(choice) is not dict or (self._cut_weight_versions and choice.get("weight_versions") is not None):
            return None
        spans = []
        logprobs = choice.get("logprobs") if self._cut_logprobs else None
        if logprobs is not None:
            span = _span_after_key(data, self.written, logprobs, _LOGPROBS, _LOGPROBS_AFTER_COMMA)
            if span is None:
                return None
            spans.append(span)
        token_ids = choice.get("token_ids") if self._cut_token_ids else None
        if token_ids is not None:
            span = _span_after_key(data, self.written, token_ids, _TOKEN_IDS, _TOKEN_IDS_AFTER_COMMA)
            if span is None:
                return None
            spans.append(span)
        if not spans:
            return None if (self._cut_logprobs and _LOGPROBS_OBJECT in data) or (
                self._cut_token_ids and _TOKEN_IDS_LIST in data) else []
        self.cut_values += len(spans)
        return spans

    def _chat_cuts(self, event_type: str, payload: dict[str, Any]) -> list[Cut]:
        cuts = []
        sglext = payload.get("sglext") if self._sglext else None
        if type(sglext) is dict and set(sglext) <= self._sglext:  # SGLang's JSON reply: the member goes whole.
            cuts.append((("sglext",), REMOVE_MEMBER))
        if "return_token_ids" in self.added and payload.get("prompt_token_ids") is not None:
            cuts.append((("prompt_token_ids",), "null"))
        cuts += self._choice_cuts(payload, ("logprobs",) if "logprobs" in self.added else (),
                                  ("token_ids",) if "return_token_ids" in self.added else (),
                                  ("weight_versions",) if self._cut_weight_versions else ())
        return cuts

    def _completions_cuts(self, event_type: str, payload: dict[str, Any]) -> list[Cut]:
        return self._choice_cuts(payload, ("logprobs",) if "logprobs" in self.added else (),
                                 ("prompt_token_ids", "token_ids") if "return_token_ids" in self.added else (),
                                 ("weight_versions",) if self._cut_weight_versions else ())

    @staticmethod
    def _choice_cuts(payload: dict[str, Any], *groups: tuple[str, ...]) -> list[Cut]:
        choices = payload.get("choices")
        if type(choices) is not list:
            return []
        cuts = []
        for position, choice in enumerate(choices):
            if type(choice) is dict:
                for group in groups:
                    for name in group:
                        if choice.get(name) is not None:
                            cuts.append((("choices", position, name), "null"))
        return cuts

    def _responses_cuts(self, event_type: str, payload: dict[str, Any]) -> list[Cut]:
        logprobs = "include" in self.added
        messages = "enable_response_messages" in self.added
        cuts: list[Cut] = []
        if event_type == "body":
            cuts += _response_object_cuts(payload, (), logprobs, messages)
        elif type(payload.get("response")) is dict:  # created, in_progress, completed, incomplete, failed
            cuts += _response_object_cuts(payload["response"], ("response",), logprobs, messages)
        elif not logprobs:
            pass
        elif event_type in ("response.output_text.delta", "response.output_text.done"):
            if payload.get("logprobs"):
                cuts.append((("logprobs",), "[]"))
        elif event_type == "response.content_part.done":
            if _is_text_part_with_logprobs(payload.get("part")):
                cuts.append((("part", "logprobs"), "null"))
        elif event_type == "response.output_item.done" and type(payload.get("item")) is dict:
            cuts += _item_cuts(payload["item"], ("item",))
        return cuts


class _ToolCallJson:
    """Mistral's pre-v11 tool-call JSON (``[TOOL_CALLS][{...}]`` or ``[TOOL_CALLS]{...}``), followed
    character by character until its first value closes: the parser's ``ALL_TOOLS_COMPLETE``.
    Text that does not start a JSON array or object (v11's ``name[ARGS]{...}``) never closes."""

    __slots__ = ("closed", "_depth", "_in_string", "_escaped", "_abandoned")

    def __init__(self) -> None:
        self.closed = False
        self._depth = 0
        self._in_string = self._escaped = self._abandoned = False

    def feed(self, text: str) -> None:
        for char in text:
            if self.closed or self._abandoned:
                return
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char in "[{":
                self._depth += 1
            elif self._depth == 0:
                self._abandoned = not char.isspace()
            elif char in "]}":
                self._depth -= 1
                self.closed = self._depth == 0
            elif char == '"':
                self._in_string = True


def _spans_in_block(spans: list[Span], data_spans: tuple[tuple[int, int], ...], raw: bytes) -> Optional[list[Span]]:
    """Spans of an event's data (its ``data:`` values joined by LF) as spans of the block's bytes.
    A span across lines takes the line ends and ``data:`` names between with it, so the data the
    client's parser joins is the cut data; None when another field stands between them."""
    if len(data_spans) == 1:
        offset = data_spans[0][0]
        return [(start + offset, end + offset, value) for start, end, value in spans]
    starts, position = [], 0
    for start, end in data_spans:
        starts.append(position)
        position += end - start + 1

    def at(position: int) -> tuple[int, int]:
        line = bisect_right(starts, position) - 1
        start, end = data_spans[line]
        return line, min(start + position - starts[line], end)

    mapped = []
    for start, end, value in spans:
        first, raw_start = at(start)
        last, raw_end = at(end)
        for line in range(first, last):
            between = raw[data_spans[line][1]:data_spans[line + 1][0]]
            if between.lstrip(b"\r\n").rstrip(b" ") != b"data:" or len(between) - len(between.lstrip(b"\r\n")) > 2:
                return None
        mapped.append((raw_start, raw_end, value))
    return mapped


def _span_after_key(data: bytes, written: dict[int, bytes], value: Any, key: bytes,
                    key_after_comma: bytes) -> Optional[Span]:
    """Where ``value``, as orjson writes it (kept in ``written`` for the capture), stands right
    after ``,<key>`` in ``data``, the key occurring only there; None when it does not."""
    text = written[id(value)] = orjson.dumps(value)
    at = data.find(key_after_comma + text)
    if at < 0 or data.count(key) != 1:
        return None
    start = at + len(key_after_comma)
    return start, start + len(text), b"null"


def _with_members_removed(data: bytes, spans: list[Span]) -> Optional[list[Span]]:
    """The spans whose replacement is empty widened to their member: the key before the value and
    the comma before the key (after the value, for a first member). None when the bytes around
    are not a plain member (never guess)."""
    widened = []
    for start, end, replacement in spans:
        if replacement:
            widened.append((start, end, replacement))
            continue
        colon = len(data[:start].rstrip())
        if data[colon - 1:colon] != b":":
            return None
        closing = len(data[:colon - 1].rstrip())
        if data[closing - 1:closing] != b'"':
            return None
        opening = data.rfind(b'"', 0, closing - 1)  # The key is a plain name (``sglext``): no escaped quote.
        before = len(data[:opening].rstrip()) if opening > 0 else 0
        if data[before - 1:before] == b",":
            widened.append((before - 1, end, b""))
        elif data[before - 1:before] == b"{":
            after = len(data) - len(data[end:].lstrip())
            if data[after:after + 1] != b",":
                return None
            widened.append((opening, after + 1, b""))
        else:
            return None
    return widened


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


def _no_cuts(cutter: AddedFieldCutter, event_type: str, payload: dict[str, Any]) -> list[Cut]:
    return []


def _response_object_cuts(response: dict[str, Any], at: tuple[Any, ...], logprobs: bool, messages: bool) -> list[Cut]:
    cuts: list[Cut] = []
    if logprobs:
        if response.get("top_logprobs") is not None:
            cuts.append(((*at, "top_logprobs"), "null"))
        output = response.get("output")
        for position, item in enumerate(output if type(output) is list else ()):
            if type(item) is dict:
                cuts += _item_cuts(item, (*at, "output", position))
    if messages:
        for name in ("input_messages", "output_messages"):
            if response.get(name) is not None:
                cuts.append(((*at, name), "null"))
    return cuts


def _item_cuts(item: dict[str, Any], at: tuple[Any, ...]) -> list[Cut]:
    content = item.get("content")
    return [((*at, "content", position, "logprobs"), "null")
            for position, part in enumerate(content if type(content) is list else ())
            if _is_text_part_with_logprobs(part)]


def _is_text_part_with_logprobs(part: Any) -> bool:
    """An ``output_text`` part whose logprobs are a list: vLLM writes null there when not asked
    (``accumulated_logprobs or None``, streaming_events.py)."""
    return type(part) is dict and part.get("type") == "output_text" and type(part.get("logprobs")) is list
