"""The token capture mode's two halves, sans-io (DESIGN §11, issue 20).

`token_fields_to_add` decides what to add to an agent's request so that vLLM returns the sampled
token ids and their logprobs, and `add_request_fields` adds them by inserting bytes before the
body's closing brace (the agent's own bytes are left as they were). `AddedFieldCutter` removes
exactly what those fields put in the reply, by cutting byte spans out of each SSE event or JSON
body -- a value replaced by what vLLM writes when the field is not asked for (``null``, ``[]``),
an event that exists only because of the added fields dropped whole -- never by re-serialising.
That is what makes the agent's bytes equal to a direct call with its own request.

What vLLM 0.32.0 writes, read from its source (``vllm/entrypoints/openai/chat_completion/
serving.py``, ``completion/protocol.py``, ``responses/serving.py`` + ``streaming_events.py``) and
checked on the recordings in ``../shared/fixtures/vllm-0.32/``:

- chat: top-level ``prompt_token_ids``, each choice's ``token_ids`` and ``logprobs``. A token
  with no text (a partial UTF-8 byte, a tool-call token a parser holds back) gets a chunk of its
  own (``"delta":{}``, no finish reason) only when ``logprobs`` or ``return_token_ids`` is asked
  (serving.py: ``delta_message is None``): dropped when the agent asked for neither.
- completions: each choice's ``logprobs``, ``prompt_token_ids`` and ``token_ids``.
- Responses: ``include: ["message.output_text.logprobs"]`` puts logprobs on ``output_text``
  parts (a list, else ``null``) and on text deltas (a list, else ``[]``), and echoes the sampler's
  ``top_logprobs`` (else ``null``); ``enable_response_messages`` fills ``input_messages`` and
  ``output_messages`` (else ``null``). vLLM's Responses request has no ``return_token_ids``.
- Messages: vLLM's Anthropic endpoint has no field for either: nothing is added.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Optional

import orjson

#: The fields each dialect gets, in the order they are added, with the values sent.
TOKEN_FIELDS: dict[str, tuple[tuple[str, Any], ...]] = {
    "chat": (("logprobs", True), ("return_token_ids", True)),
    "completions": (("logprobs", 0), ("return_token_ids", True)),
    "responses": (("include", ["message.output_text.logprobs"]), ("enable_response_messages", True)),
    "messages": (),
}

_scan_value = json.JSONDecoder().scan_once  # (text, index) -> (value, end): the C scanner.
_scan_string = json.decoder.scanstring  # (text, index after the opening quote) -> (text, end)
_SPACE = re.compile(r"[ \t\n\r]*")
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def token_fields_to_add(dialect: str, request: dict[str, Any], refused: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The fields to add to ``request`` (parsed): those of `TOKEN_FIELDS` the agent did not set
    (a field it set, even to null or false, is its own), minus those the upstream ``refused``."""
    added = {}
    for name, value in TOKEN_FIELDS.get(dialect, ()):
        if name not in request and name not in refused:
            added[name] = value
    if dialect == "responses" and request.get("background"):
        added.pop("enable_response_messages", None)  # vLLM refuses it for background requests.
    return added


def add_request_fields(body: bytes, fields: dict[str, Any]) -> Optional[bytes]:
    """``body`` (a JSON object) with ``fields`` inserted before its closing brace, else None."""
    end = body.rstrip().rfind(b"}")
    if end < 0 or not fields:
        return None
    inserted = b",".join(orjson.dumps(name) + b":" + orjson.dumps(value) for name, value in fields.items())
    before = body[:end].rstrip()
    separator = b"" if before.endswith(b"{") else b","
    return body[:end] + separator + inserted + body[end:]


class AddedFieldCutter:
    """Cut from one reply what the fields in ``added`` put there (``request`` is the agent's own).

    `feed` takes the upstream's bytes and returns the agent's, one whole SSE event at a time (an
    event may span chunks: its start waits for its end); `close` returns what is left. `cut_body`
    does the same for a whole JSON body. An event or body that cannot be read is passed on as it
    came: cutting never guesses.
    """

    def __init__(self, dialect: str, added: dict[str, Any], request: dict[str, Any]) -> None:
        self.dialect = dialect
        self.added = added
        self._pending = b""
        #: The JSON this cutter wrote of a value of the current event, by ``id(value)``: the tap's
        #: fold reuses it for the per-token lists (`Reassembler.written`); cleared per event.
        self.written: dict[int, bytes] = {}
        #: Events dropped whole and values cut, for the line and the tests.
        self.dropped_events = 0
        self.cut_values = 0
        asked_token_data = bool(request.get("logprobs")) or bool(request.get("return_token_ids"))
        self._cut_logprobs = "logprobs" in added
        self._cut_token_ids = "return_token_ids" in added
        self._drop_empty_chunks = dialect == "chat" and not asked_token_data
        self._rules: Callable[[str, dict[str, Any]], list[tuple[tuple[Any, ...], str]]] = {
            "chat": self._chat_cuts, "completions": self._completions_cuts, "responses": self._responses_cuts,
        }.get(dialect, _no_cuts)

    # -- streams ---------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Bytes of an unfinished event are waiting for the rest of it."""
        return bool(self._pending)

    def cut_part(self, part: bytes, event_type: str, data: bytes, payload: Any) -> bytes:
        """One whole event the caller already framed and parsed (`SSEParser.feed_plain`: its
        ``lines``, its ``data``, the data parsed or None), cut, with its blank line."""
        if type(payload) is not dict:
            return part + b"\n\n"
        if self.dialect == "chat":  # The hot path, on the event's own lines (no key is before its data).
            cut = self._chat_token_chunk(part, payload)
            if cut is _DROP:
                self.dropped_events += 1
                return b""
            if cut is not None:
                return (part if cut is _UNCHANGED else cut) + b"\n\n"
        cut = self._cut_parsed(data, event_type, payload)
        if cut is None:
            self.dropped_events += 1
            return b""
        if cut is _UNCHANGED:
            return part + b"\n\n"
        return part[:len(part) - len(data)] + cut + b"\n\n"

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk if self._pending else chunk
        out: list[bytes] = []
        start = 0
        if b"\r" not in data:  # LF line ends, as vLLM writes: a plain search per event.
            while True:
                end = data.find(b"\n\n", start)
                if end < 0:
                    break
                out.append(self._event(data[start:end + 2]))
                start = end + 2
        else:
            while True:
                match = _EVENT_END.search(data, start)
                if match is None:
                    break
                out.append(self._event(data[start:match.end()]))
                start = match.end()
        self._pending = data[start:]
        # What was written here was of payloads this cutter parsed itself: nobody else may see them
        # (an id is reused once its object is gone).
        self.written.clear()
        return b"".join(out) if len(out) != 1 else out[0]

    def close(self) -> bytes:
        """What is left of an unterminated last event, as it came (it is not an event: SSE drops it)."""
        rest, self._pending = self._pending, b""
        return rest

    def _event(self, block: bytes) -> bytes:
        """One SSE event (its lines and blank line): the JSON of its single ``data`` line cut."""
        if block[:6] == b"data: " and block.find(b"\n", 6) == len(block) - 2 and block[-2:] == b"\n\n":
            cut = self._cut_json(block[6:-2], "message")  # The shape vLLM writes: one line, LF.
            if cut is None:
                self.dropped_events += 1
                return b""
            return block if cut is _UNCHANGED else b"data: " + cut + b"\n\n"
        data_at = block.find(b"data:")
        if data_at < 0 or (data_at > 0 and block[data_at - 1] not in b"\r\n"):
            return block
        value_start = data_at + 5
        if block[value_start:value_start + 1] == b" ":
            value_start += 1
        line_end = len(block)
        for terminator in (b"\r", b"\n"):
            found = block.find(terminator, value_start)
            if 0 <= found < line_end:
                line_end = found
        if block.find(b"data:", line_end) >= 0:
            return block  # Multi-line data: not what vLLM sends; left as it came.
        event_type = "message"
        type_at = block.find(b"event:", 0, data_at)
        if type_at >= 0 and (type_at == 0 or block[type_at - 1] in b"\r\n"):
            event_type = block[type_at + 6:block.find(b"\n", type_at)].strip().decode("utf-8", "replace")
        cut = self._cut_json(block[value_start:line_end], event_type)
        if cut is None:
            self.dropped_events += 1
            return b""
        if cut is _UNCHANGED:
            return block
        return block[:value_start] + cut + block[line_end:]

    # -- bodies ----------------------------------------------------------------------------

    def cut_body(self, body: bytes) -> bytes:
        """A whole JSON body with the added fields' values cut (never dropped)."""
        cut = self._cut_json(body, "body")
        self.written.clear()
        return body if cut is None or cut is _UNCHANGED else cut

    # -- the cutting -----------------------------------------------------------------------

    def _cut_json(self, data: bytes, event_type: str) -> Any:
        """The cut bytes, `_UNCHANGED`, or None when the whole event goes."""
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            return _UNCHANGED
        if type(payload) is not dict:
            return _UNCHANGED
        return self._cut_parsed(data, event_type, payload)

    def _cut_parsed(self, data: bytes, event_type: str, payload: dict[str, Any]) -> Any:
        if self.dialect == "chat":
            if self._drop_empty_chunks and _only_token_data(payload):
                return None
            cut = self._chat_token_chunk(data, payload)
            if cut is _DROP:
                return None
            if cut is not None:
                return cut
        elif event_type == "message" and type(payload.get("type")) is str:
            event_type = payload["type"]
        cuts = self._rules(event_type, payload)
        if not cuts:
            return _UNCHANGED
        found = _found_spans(data, cuts, payload)
        if found is not None:
            self.cut_values += len(found)
            return _spliced(data, found)
        text = data.decode("utf-8", "surrogateescape")  # Round-trips every byte exactly.
        spans = []
        for path, replacement in cuts:
            span = _value_span(text, path)
            if span is None:  # The parsed payload has it, so the text must: never guess.
                return _UNCHANGED
            if text[span[0]:span[1]] != replacement:
                spans.append((span[0], span[1], replacement))
        if not spans:
            return _UNCHANGED
        self.cut_values += len(spans)
        return _spliced(text, spans).encode("utf-8", "surrogateescape")

    def _chat_token_chunk(self, data: bytes, payload: dict[str, Any]) -> Optional[bytes]:
        """The hot path: a chat chunk of one choice, as vLLM writes one per token -- its
        ``logprobs`` and ``token_ids`` values cut where the key, right after a ``,``, is followed
        by exactly the value the parse found (orjson writes vLLM's compact JSON the same way),
        and no other key of that name is in the event. None: take the general way."""
        choices = payload.get("choices")
        if type(choices) is not list or len(choices) != 1 or payload.get("prompt_token_ids") is not None:
            return None
        choice = choices[0]
        if type(choice) is not dict:
            return None
        if self._drop_empty_chunks and choice.get("delta") == {} and choice.get("finish_reason") is None \
                and payload.get("usage") is None and payload.get("error") is None:
            return _DROP  # A token's logprob / id alone: the agent's own request has no such chunk.
        first = second = None
        logprobs = choice.get("logprobs") if self._cut_logprobs else None
        if logprobs is not None:
            first = _span_after_key(data, self.written, logprobs, _LOGPROBS, _LOGPROBS_AFTER_COMMA)
            if first is None:
                return None
        token_ids = choice.get("token_ids") if self._cut_token_ids else None
        if token_ids is not None:
            second = _span_after_key(data, self.written, token_ids, _TOKEN_IDS, _TOKEN_IDS_AFTER_COMMA)
            if second is None:
                return None
        if first is None and second is None:
            return None if (self._cut_logprobs and _LOGPROBS_OBJECT in data) or (
                self._cut_token_ids and _TOKEN_IDS_LIST in data) else _UNCHANGED
        if first is None or second is None:
            start, end = first or second  # type: ignore[misc]
            self.cut_values += 1
            return data[:start] + b"null" + data[end:]
        if second[0] < first[0]:
            first, second = second, first
        self.cut_values += 2
        return data[:first[0]] + b"null" + data[first[1]:second[0]] + b"null" + data[second[1]:]

    def _chat_cuts(self, event_type: str, payload: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
        cuts = []
        if "return_token_ids" in self.added and payload.get("prompt_token_ids") is not None:
            cuts.append((("prompt_token_ids",), "null"))
        cuts += self._choice_cuts(payload, ("logprobs",) if "logprobs" in self.added else (),
                                  ("token_ids",) if "return_token_ids" in self.added else ())
        return cuts

    def _completions_cuts(self, event_type: str, payload: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
        return self._choice_cuts(payload, ("logprobs",) if "logprobs" in self.added else (),
                                 ("prompt_token_ids", "token_ids") if "return_token_ids" in self.added else ())

    @staticmethod
    def _choice_cuts(payload: dict[str, Any], *groups: tuple[str, ...]) -> list[tuple[tuple[Any, ...], str]]:
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

    def _responses_cuts(self, event_type: str, payload: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
        logprobs = "include" in self.added
        messages = "enable_response_messages" in self.added
        cuts: list[tuple[tuple[Any, ...], str]] = []
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


def _span_after_key(data: bytes, written: dict[int, bytes], value: Any, key: bytes,
                    key_after_comma: bytes) -> Optional[tuple[int, int]]:
    """Where ``value``, as orjson writes it (kept in ``written`` for the capture), stands right
    after ``,<key>`` in ``data``, the key occurring only there; None when it does not."""
    text = written[id(value)] = orjson.dumps(value)
    at = data.find(key_after_comma + text)
    if at < 0 or data.count(key) != 1:
        return None
    start = at + len(key_after_comma)
    return start, start + len(text)


_UNCHANGED = object()
_DROP = object()


def _no_cuts(event_type: str, payload: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    return []


_LOGPROBS, _LOGPROBS_AFTER_COMMA, _LOGPROBS_OBJECT = b'"logprobs":', b',"logprobs":', b'"logprobs":{'
_TOKEN_IDS, _TOKEN_IDS_AFTER_COMMA, _TOKEN_IDS_LIST = b'"token_ids":', b',"token_ids":', b'"token_ids":['


def _only_token_data(payload: dict[str, Any]) -> bool:
    """A chat chunk whose every choice has an empty delta and no finish reason, without usage:
    it exists only to carry a token's logprobs / ids (vLLM serving.py, ``delta_message is None``)."""
    choices = payload.get("choices")
    if type(choices) is not list or not choices or payload.get("usage") is not None or payload.get("error") is not None:
        return False
    for choice in choices:
        if type(choice) is not dict or choice.get("delta") != {} or choice.get("finish_reason") is not None:
            return False
    return True


def _response_object_cuts(response: dict[str, Any], at: tuple[Any, ...], logprobs: bool,
                          messages: bool) -> list[tuple[tuple[Any, ...], str]]:
    cuts: list[tuple[tuple[Any, ...], str]] = []
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


def _item_cuts(item: dict[str, Any], at: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], str]]:
    content = item.get("content")
    return [((*at, "content", position, "logprobs"), "null")
            for position, part in enumerate(content if type(content) is list else ())
            if _is_text_part_with_logprobs(part)]


def _is_text_part_with_logprobs(part: Any) -> bool:
    """An ``output_text`` part whose logprobs are a list: vLLM writes null there when not asked
    (``accumulated_logprobs or None``, streaming_events.py)."""
    return type(part) is dict and part.get("type") == "output_text" and type(part.get("logprobs")) is list


def _found_spans(data: bytes, cuts: list[tuple[tuple[Any, ...], str]],
                 payload: dict[str, Any]) -> Optional[list[tuple[int, int, bytes]]]:
    """The cuts' spans found by searching for each key with its value (the fast way), or None
    to walk instead.

    Each value is looked for as ``"name":`` + the value as orjson writes it, right after a ``{``
    or ``,``: inside a JSON string every quote is escaped, so that is a key, never text; and the
    bytes are vLLM's compact JSON, which orjson writes the same way (a difference in a float's
    digits or an escape only sends the event to the walk). Each such key-and-value must occur
    exactly as many times as there are cuts for it, or the event is walked.
    """
    spans = []
    next_from: dict[bytes, int] = {}
    for path, replacement in cuts:
        key = _KEYS.get(path[-1]) or b'"' + path[-1].encode() + b'":'
        pattern = key + orjson.dumps(_at(payload, path))
        at = data.find(pattern, next_from.get(pattern, 0))
        if at <= 0 or data[at - 1] not in _KEY_BEFORE:
            return None
        end = at + len(pattern)
        next_from[pattern] = end
        spans.append((at + len(key), end, replacement.encode()))
    for pattern, end in next_from.items():
        if data.find(pattern, end) >= 0:
            return None  # One more than there are cuts: which is which is not known.
    return spans


#: The keys the mode cuts, as they appear in compact JSON.
_KEYS = {name: b'"' + name.encode() + b'":' for name in (
    "logprobs", "token_ids", "prompt_token_ids", "top_logprobs", "input_messages", "output_messages")}


def _spliced(data: Any, spans: list[tuple[int, int, Any]]) -> Any:
    """``data`` (bytes or text) with each span replaced."""
    spans.sort()
    pieces, position = [], 0
    for start, end, replacement in spans:
        pieces += (data[position:start], replacement)
        position = end
    pieces.append(data[position:])
    return data[:0].join(pieces)


#: What precedes a key in compact JSON (vLLM writes no spaces between members): ``{`` and ``,``.
_KEY_BEFORE = frozenset(b"{,")


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value


def _value_span(text: str, path: tuple[Any, ...]) -> Optional[tuple[int, int]]:
    """The [start, end) of the JSON value at ``path`` (keys and list positions) in ``text``.

    Walks only the containers on the path; every value beside it is skipped by the C scanner,
    so the cost is a parse of what precedes the value at each level, never a Python loop over
    characters.
    """
    try:
        index = _SPACE.match(text, 0).end()  # type: ignore[union-attr]
        for step in path:
            if type(step) is str:
                index = _member(text, index, step)
            else:
                index = _element(text, index, step)
            if index is None:
                return None
        _, end = _scan_value(text, index)
        return index, end
    except (StopIteration, ValueError, IndexError):
        return None


def _member(text: str, index: int, name: str) -> Optional[int]:
    """Where the value of member ``name`` of the object at ``index`` starts."""
    if text[index] != "{":
        return None
    index = _SPACE.match(text, index + 1).end()  # type: ignore[union-attr]
    while text[index] == '"':
        key, index = _scan_string(text, index + 1)
        index = _SPACE.match(text, index).end()  # type: ignore[union-attr]
        if text[index] != ":":
            return None
        index = _SPACE.match(text, index + 1).end()  # type: ignore[union-attr]
        if key == name:
            return index
        _, index = _scan_value(text, index)
        index = _SPACE.match(text, index).end()  # type: ignore[union-attr]
        if text[index] != ",":
            return None
        index = _SPACE.match(text, index + 1).end()  # type: ignore[union-attr]
    return None


def _element(text: str, index: int, position: int) -> Optional[int]:
    """Where element ``position`` of the list at ``index`` starts."""
    if text[index] != "[":
        return None
    index = _SPACE.match(text, index + 1).end()  # type: ignore[union-attr]
    for _ in range(position):
        _, index = _scan_value(text, index)
        index = _SPACE.match(text, index).end()  # type: ignore[union-attr]
        if text[index] != ",":
            return None
        index = _SPACE.match(text, index + 1).end()  # type: ignore[union-attr]
    return index if text[index] != "]" else None
