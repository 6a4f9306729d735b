"""Reassembly of an OpenAI Chat Completions stream (docs/files.md).

Follows openai-python's ``ChatCompletionStreamState``: one choice per ``index`` (n > 1 kept
apart), content / refusal / reasoning appended, tool calls merged by their ``index``, logprobs
concatenated, ``usage`` from whichever chunk carries it (an error chunk included: OpenRouter sends
the call's usage on the error that follows ``finish_reason: length``), ``data: [DONE]`` as the
terminal. A chunk with ``error`` (vLLM's in-stream failure) makes the call an error.

Everything a chunk carries is kept, in time linear in the stream (RL rollouts stream 8k-64k
tokens, one logprob entry and one token id per chunk). Fields this module does not know follow
one rule, `merge_unknown`: a list that arrives per chunk is concatenated in arrival order (vLLM's
per-choice ``token_ids``); any other value is replaced by the last non-null one (``stop_reason``,
OpenRouter's ``native_finish_reason``). Inside a ``delta`` unknown text is concatenated too, as
the SDK's ``accumulate_delta`` does, since a delta carries pieces. The chunk's own top-level
fields describe the whole call, not a piece of it: the last non-null value wins there, lists
included. vLLM writes ``prompt_token_ids`` on the first chunk of *each* choice (n > 1 repeats
the same list), so concatenating it would double the prompt.
"""

from __future__ import annotations

from array import array
from itertools import chain
from typing import Any, Optional

import orjson

from ._event_templates import INTS, NUMBER, TEXT, EventTemplate, Slot, learn_template, split_at, written_rows
from ._reassembler import JOIN_EVERY, Reassembler, grow_list

_ENVELOPE_KEYS = ("id", "created", "model", "system_fingerprint", "service_tier")
# Top-level chunk keys with their own handling; every other key goes through `merge_unknown`.
_KNOWN_CHUNK_KEYS = frozenset({*_ENVELOPE_KEYS, "object", "choices", "usage", "error"})
# Choice keys with their own handling; vLLM's `token_ids` and `stop_reason` follow the generic rule
# (`merge_unknown`) but are read directly: they are on every chunk of an RL stream.
_KNOWN_CHOICE_KEYS = frozenset({"index", "delta", "finish_reason", "logprobs", "token_ids", "stop_reason"})
# Text fields of a delta that are concatenated; reasoning arrives as either name (docs/files.md).
_TEXT_KEYS = frozenset({"content", "refusal", "reasoning_content", "reasoning"})
# The chunk a server writes for each token of text, which `_on_payload` folds on its hot path: these
# top-level keys at most (``usage`` null), one choice with these keys at most (``finish_reason``
# null; vLLM's ``logprobs`` object and ``token_ids`` list, or neither), and a delta of one text field.
_TEXT_CHUNK_KEYS = frozenset({*_ENVELOPE_KEYS, "object", "choices", "usage"})
_TEXT_CHOICE_KEYS = frozenset({"index", "delta", "finish_reason", "logprobs", "token_ids"})
#: A logprob entry a template takes: vLLM's, without top logprobs (the token capture mode asks none).
_ENTRY_KEYS = frozenset({"token", "logprob", "bytes", "top_logprobs"})


class ChatReassembler(Reassembler):
    done_is_terminal = True
    dialect = "chat"
    #: Keep each token's logprob as a float beside its JSON (the token capture mode's entries).
    collect_logprobs = False
    #: Keep the logprob entries' JSON too. Off in the token capture mode when the agent did not ask
    #: for logprobs: its line has none, and the floats are all the training entry takes (a
    #: 12k-token stream's entries are ~1 MiB held until its end: issue 34).
    keep_logprob_entries = True

    def __init__(self) -> None:
        super().__init__()
        self._envelope: dict[str, Any] = {}
        self._envelope_missing: tuple[str, ...] = _ENVELOPE_KEYS
        self._extras: dict[str, Any] = {}
        self._choices: list[dict[str, Any] | None] = []
        self._usage: Any = None
        self._error: Any = None
        #: Per choice: its per-token lists (logprob entries, token ids) as JSON (`TokenArrays`).
        self._arrays: dict[int, TokenArrays] = {}
        #: The text the last hot chunk grew: (its message, its field, its pieces: `append_text`).
        self._open_text: tuple[dict[str, Any], str, list[str]] | None = None

    def seen_whole(self) -> bool:
        return self._choices_seen_whole(self._choices, self._usage, self._error)

    def collected_arrays(self) -> dict[int, tuple[list[int] | None, list[float] | None]] | None:
        """Per choice index: its generated ids and logprobs as the stream carried them; None when
        the logprobs were not collected whole (`collect_logprobs` off, or not vLLM's shape)."""
        collected = self.collected()
        return collected.lists() if collected is not None else None

    def collected(self) -> "CollectedArrays | None":
        """`collected_arrays`, kept compact until it is read."""
        found: dict[int, tuple[bytes | None, array]] = {}
        for index, arrays in self._arrays.items():
            if arrays.logprob_values is None:
                return None
            found[index] = (arrays.ids_json(), arrays.logprob_values)
        return CollectedArrays(found)

    def result(self) -> dict[str, Any] | None:
        if not self._envelope and not self._choices and self._error is None:
            return None
        self.join_texts()
        return choices_reply("chat.completion", self._envelope, self._choices, self._arrays, self.compact_arrays,
                             self._usage, self._extras, self._error)

    def _fold(self, event_type: str, payload: dict[str, Any]) -> None:
        self._on_payload(event_type, payload)  # A chat chunk's `type` (if any) decides nothing.

    def fold_plain(self, events: list[tuple[str, bytes, bytes]]) -> None:
        """The plain events of one read in one loop: each chunk parsed and given to `_on_payload`
        (``[DONE]`` and anything not a JSON object: `feed_data`, which tells them apart)."""
        loads, on_payload = orjson.loads, self._on_payload
        for event_type, data, _ in events:
            if self.terminal:
                return
            try:
                payload = loads(data)
            except orjson.JSONDecodeError:
                payload = None
            if type(payload) is dict:
                on_payload(event_type, payload)
            elif data == b"[DONE]":
                self.terminal = True  # What `feed_data` makes of it (`done_is_terminal`), without its detour.
            else:
                self.feed_data(event_type, data)

    def _on_payload(self, event_type: str, payload: dict[str, Any]) -> None:
        # Hot path (issue 34): a token's text, as servers stream it -- the same outcome as the
        # general path below, for a third of the work. Anything else takes the general path.
        choices = payload.get("choices")
        if (type(choices) is list and len(choices) == 1 and not self._envelope_missing
                and payload.keys() <= _TEXT_CHUNK_KEYS and payload.get("usage") is None):
            chunk_choice = choices[0]
            logprobs = chunk_choice.get("logprobs") if type(chunk_choice) is dict else None
            token_ids = chunk_choice.get("token_ids", ()) if type(chunk_choice) is dict else None
            if (type(chunk_choice) is dict and chunk_choice.keys() <= _TEXT_CHOICE_KEYS
                    and chunk_choice.get("finish_reason") is None and (logprobs is None or type(logprobs) is dict)
                    and (token_ids == () or type(token_ids) is list)):
                delta = chunk_choice.get("delta")
                if type(delta) is dict and len(delta) == 1:
                    key, piece = next(iter(delta.items()))
                    index = chunk_choice.get("index", 0)
                    known = self._choices
                    if (key in _TEXT_KEYS and type(piece) is str and type(index) is int
                            and 0 <= index < len(known) and known[index] is not None):
                        choice: dict[str, Any] = known[index]  # type: ignore[assignment]  # not None: checked above
                        message, open_text = choice["message"], self._open_text
                        if (open_text is not None and open_text[0] is message and open_text[1] == key
                                and len(open_text[2]) < JOIN_EVERY - 1):
                            open_text[2].append(piece)  # `append_text`, without its lookup.
                        else:
                            self._open_text = (message, key, self.append_text(message, key, piece))
                        if logprobs is not None or token_ids != ():
                            self._token_data(index, choice, logprobs, token_ids)
                        return
        if self._envelope_missing:
            self._fill_envelope(payload)
        elif "system_fingerprint" not in self._envelope and payload.get("system_fingerprint") is not None:
            # vLLM names its engine on the usage chunk only (the SDK's snapshot takes it from there).
            self._envelope["system_fingerprint"] = payload["system_fingerprint"]
        usage = payload.get("usage")
        if usage is not None:
            self._usage = usage
        if type(choices) is list:
            for chunk_choice in choices:
                if type(chunk_choice) is dict:
                    self._on_choice(chunk_choice)
        if not payload.keys() <= _KNOWN_CHUNK_KEYS:  # One C-level check on the common chunk.
            for key in payload:
                if key not in _KNOWN_CHUNK_KEYS:
                    value = payload[key]
                    if value is not None or key not in self._extras:
                        self._extras[key] = value  # prompt_token_ids, provider, ...: the call's, not a piece.
        if payload.get("error") is not None:
            # The error event ends the reply for the SDK (openai raises there), whatever follows,
            # so it is the terminal that "durable before terminal" holds back (docs/files.md).
            self.error_category = "upstream_error"
            self._error = payload["error"]
            self.terminal = True
        elif self.ends_when_whole:
            self._ended_if_whole()  # Off the hot path: only a chunk the hot path did not take ends a reply.

    def learn_template(self, prefix: bytes, data: bytes, payload: Any = None, event_type: str = "message"
                       ) -> Optional[tuple[EventTemplate, bytes, dict[str, Any], list[bytes]]]:
        """The template of a token's chunk just folded (`capture._event_templates`; ``payload``: its
        data parsed, if it was): its text, its logprob entries' token, logprob and bytes, and its
        token ids are the slots; its fold is `_on_payload`'s hot path (`_on_choice`'s for a chunk
        with an empty delta), once per run."""
        payload = self.template_payload(data, payload) if not self._envelope_missing else None
        slots = self._template_slots(payload) if payload is not None else None
        learnt = learn_template(prefix, data, payload, slots) if slots else None
        if learnt is None:
            return None
        template, _, marked, markers = learnt
        index = payload["choices"][0].get("index", 0)
        entries = None
        if any(name[0] == "logprob" for name in template.names):
            # The entries' JSON as the general path keeps it: orjson's, from the marked entries.
            entry_names = [name for name in template.names if name[0] in ("token", "logprob", "bytes")]
            written = orjson.dumps(marked["choices"][0]["logprobs"]["content"])[1:-1]
            split = split_at(written, [markers[template.names.index(name)] for name in entry_names])
            if split is None or len(split[1]) != len(entry_names):
                return None
            entries = (split[0], [template.names.index(entry_names[position]) for position in split[1]])
        template.fold = self._template_fold(template, index, entries)
        return learnt

    def _template_slots(self, payload: dict[str, Any]) -> Optional[list[Slot]]:
        """The slots of a chunk `_on_payload` folds on its hot path (or with an empty delta and token
        data), with its choice already known; None for any other chunk."""
        choices = payload.get("choices")
        if (type(choices) is not list or len(choices) != 1 or not payload.keys() <= _TEXT_CHUNK_KEYS
                or payload.get("usage") is not None):
            return None
        choice = choices[0]
        if type(choice) is not dict or not choice.keys() <= _TEXT_CHOICE_KEYS or choice.get("finish_reason") is not None:
            return None
        index = choice.get("index", 0)
        if not (type(index) is int and 0 <= index < len(self._choices) and self._choices[index] is not None):
            return None
        delta = choice.get("delta")
        if type(delta) is not dict or len(delta) > 1:
            return None
        slots: list[Slot] = []
        for key, piece in delta.items():
            if key not in _TEXT_KEYS or type(piece) is not str:
                return None
            slots.append((("text", key), ("choices", 0, "delta", key), TEXT))
        logprobs = choice.get("logprobs")
        if logprobs is not None:
            entries = logprobs.get("content") if type(logprobs) is dict and len(logprobs) == 1 else None
            if type(entries) is not list:
                return None
            for position, entry in enumerate(entries):
                if (type(entry) is not dict or entry.keys() != _ENTRY_KEYS or entry["top_logprobs"] != []
                        or type(entry["token"]) is not str or type(entry["logprob"]) not in (float, int)):
                    return None
                at = ("choices", 0, "logprobs", "content", position)
                slots += [(("token", position), (*at, "token"), TEXT), (("logprob", position), (*at, "logprob"), NUMBER)]
                if entry["bytes"] is not None:
                    if type(entry["bytes"]) is not list or any(type(item) is not int for item in entry["bytes"]):
                        return None
                    slots.append((("bytes", position), (*at, "bytes"), INTS))
        token_ids = choice.get("token_ids", None)
        if token_ids is not None:
            if type(token_ids) is not list or any(type(item) is not int for item in token_ids):
                return None
            slots.append((("token_ids",), ("choices", 0, "token_ids"), INTS))
        return slots

    def _template_fold(self, template: EventTemplate, index: int,
                       entries: Optional[tuple[list[bytes], list[int]]]) -> Any:
        """A run's fold: what `_on_payload` does for each of its chunks, once for all of them."""
        names = template.names
        text = next(((position, name[1]) for position, name in enumerate(names) if name[0] == "text"), None)
        logprobs = [position for position, name in enumerate(names) if name[0] == "logprob"]
        token_ids = names.index(("token_ids",)) if ("token_ids",) in names else None
        choice = self._choices[index]
        assert choice is not None
        message = choice["message"]

        def fold(columns: list[list[bytes]], count: int, decoded: list[Any]) -> None:
            if text is not None:
                self.append_text(message, text[1], decoded[text[0]])
            if not logprobs and token_ids is None:
                return
            arrays = self._arrays_of(index)
            if logprobs:
                values = decoded[logprobs[0]] if len(logprobs) == 1 else list(
                    chain.from_iterable(zip(*(decoded[position] for position in logprobs))))
                if choice["logprobs"] is None:
                    choice["logprobs"] = {"content": None, "refusal": None}
                if arrays.logprob_values is not None:
                    arrays.logprob_values.extend(values)
                if arrays.logprob_values is None or arrays.keeps_entries:
                    assert entries is not None
                    segments, columns_of = entries
                    kept = written_rows(segments[:-1] + [segments[-1] + b","], [columns[position] for position in columns_of],
                                        count)[:-1]
                    arrays.extend_json("logprobs.content", kept)
            if token_ids is not None:
                ids = columns[token_ids]
                arrays.extend_json("token_ids", b",".join(filter(None, ids[:count] if count < len(ids) else ids)))

        return fold

    def _arrays_of(self, index: int) -> TokenArrays:
        """The choice's token arrays, made at its first token data."""
        return self._arrays.get(index) or self._arrays.setdefault(
            index, TokenArrays(self.collect_logprobs, self.keep_logprob_entries))

    def _token_data(self, index: int, choice: dict[str, Any], logprobs: Any, token_ids: Any) -> None:
        """A hot chunk's logprobs and token ids, as `_on_choice` folds them (the token capture mode's
        chunk, one per token: issue 34)."""
        arrays = self._arrays_of(index)
        written = self.written
        if logprobs is not None:
            choice["logprobs"] = arrays.merge_logprobs(choice["logprobs"], logprobs,
                                                       written=written.get(id(logprobs)) if written else None)
        if token_ids != ():
            arrays.extend("token_ids", token_ids, written.get(id(token_ids)) if written else None)

    def _fill_envelope(self, payload: dict[str, Any]) -> None:
        """id, created, model, ... from the first chunk with an id (the SDK snapshots the first chunk)."""
        for key in _ENVELOPE_KEYS:
            if payload.get(key) is not None:
                self._envelope[key] = payload[key]
        if "id" in self._envelope:
            self._envelope_missing = ()

    def _on_choice(self, chunk_choice: dict[str, Any]) -> None:
        index = chunk_choice.get("index", 0)
        choices = self._choices
        choice = choices[index] if type(index) is int and 0 <= index < len(choices) else None
        if choice is None:
            if index == len(choices) and type(index) is int:
                choices.append(None)  # The next choice (n > 1: each in turn): `grow_list` without the call.
            elif not grow_list(choices, index):
                return
            choice = choices[index] = {"index": index, "message": {"role": "assistant", "content": None},
                                       "finish_reason": None, "logprobs": None}
        get = chunk_choice.get
        delta = get("delta")
        if type(delta) is dict and delta:
            self._merge_delta(choice["message"], delta)
        finish_reason = get("finish_reason")
        if finish_reason is not None:
            choice["finish_reason"] = finish_reason
        logprobs = get("logprobs")
        written = self.written
        if type(logprobs) is dict:
            arrays = self._arrays_of(index)
            choice["logprobs"] = arrays.merge_logprobs(choice["logprobs"], logprobs, written=written.get(id(logprobs))
                                                       if written else None)
        if "token_ids" in chunk_choice:
            token_ids = chunk_choice["token_ids"]
            if type(token_ids) is list:  # vLLM's: concatenated.
                self._arrays_of(index).extend(
                    "token_ids", token_ids, written.get(id(token_ids)) if written else None)
            else:
                merge_unknown(choice, "token_ids", token_ids)
        if "stop_reason" in chunk_choice:
            merge_unknown(choice, "stop_reason", chunk_choice["stop_reason"])
        if not chunk_choice.keys() <= _KNOWN_CHOICE_KEYS:
            for key, value in chunk_choice.items():
                if key not in _KNOWN_CHOICE_KEYS:
                    merge_unknown(choice, key, value)

    def _merge_delta(self, message: dict[str, Any], delta: dict[str, Any]) -> None:
        for key, piece in delta.items():
            if key in _TEXT_KEYS:
                if type(piece) is str:  # Open for the hot chunks that follow (`_on_payload`).
                    self._open_text = (message, key, self.append_text(message, key, piece))
            elif key == "role":
                if type(piece) is str:
                    message["role"] = piece
            elif key == "tool_calls":
                if type(piece) is list:
                    for fragment in piece:
                        if type(fragment) is dict:
                            self._merge_tool_call(message.setdefault("tool_calls", []), fragment)
            elif type(piece) is str:
                self.append_text(message, key, piece)
            else:
                merge_unknown(message, key, piece)

    def _merge_tool_call(self, calls: list[Any], fragment: dict[str, Any]) -> None:
        """Fragments of one call share an ``index``; id, type and name arrive once, arguments in pieces."""
        index = fragment.get("index", len(calls))
        if not grow_list(calls, index):
            return
        call = calls[index]
        if call is None:
            call = calls[index] = {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        for key in ("id", "type"):
            if isinstance(fragment.get(key), str) and fragment[key]:
                call[key] = fragment[key]
        function = fragment.get("function")
        if isinstance(function, dict):
            for key in ("name", "arguments"):
                if isinstance(function.get(key), str):
                    self.append_text(call["function"], key, function[key])


def choices_reply(reply_object: str | None, envelope: dict[str, Any], choices: list[dict[str, Any] | None],
                  arrays: "dict[int, TokenArrays]", compact: bool, usage: Any, extras: dict[str, Any],
                  error: Any) -> dict[str, Any]:
    """The reply a choices stream (chat, completions, vLLM's generate) comes to: its ``object``, the
    envelope, the choices with their token arrays put in, the usage, the extras, the error."""
    reply: dict[str, Any] = ({"object": reply_object} if reply_object else {}) | envelope
    reply["choices"] = [arrays[choice["index"]].put_into(choice, compact) if choice["index"] in arrays else choice
                        for choice in choices if choice is not None]
    if usage is not None:
        reply["usage"] = usage
    for key, value in extras.items():
        reply.setdefault(key, value)
    if error is not None:
        reply["error"] = error
    return reply


def merge_unknown(target: dict[str, Any], key: str, value: Any) -> None:
    """The rule for a field the reassembler does not know: lists concatenate, else last non-null wins.

    The list is extended in place (amortised O(len(value))), never copied per chunk: a copy per
    chunk is quadratic in a 32k-token stream. The lists belong to payloads parsed from the
    stream, which nothing else holds.
    """
    current = target.get(key)
    if type(value) is list:
        if type(current) is list:
            current.extend(value)
        else:
            target[key] = value
    elif value is not None or key not in target:
        target[key] = value


class CollectedArrays:
    """Each choice's generated ids and logprobs as a stream carried them, compact -- the ids as
    their JSON, the logprobs an array of floats -- until `lists` parses them: a copy when pickled
    (the token mode's line is built in the capture process, docs/tokens.md), not an object per token."""

    __slots__ = ("choices",)

    def __init__(self, choices: dict[int, tuple[bytes | None, array]]) -> None:
        self.choices = choices

    def lists(self) -> dict[int, tuple[list[int] | None, list[float] | None]]:
        """Per choice index: its ids and logprobs, parsed."""
        return {index: (None if ids is None else orjson.loads(b"[" + ids + b"]"), values.tolist())
                for index, (ids, values) in self.choices.items()}


class TokenArrays:
    """One choice's per-token lists, kept as the JSON text of their items, not as Python objects.

    A logprob entry as a dict with its lists costs ~400 bytes of Python objects; as JSON it is
    ~80 bytes, and the cyclic GC never sees it. An RL batch is 256 streams of 8k-32k tokens at
    once, each with a logprob entry and a token id per token (issue 20: at most 1 GiB for 256 x
    8k), so this is what bounds the sidecar's memory. Each chunk's list is serialised by orjson
    (C speed) and appended; `put_into` gives the lists back whole: parsed, or as `orjson.Fragment`
    (``compact``) so the capture line embeds the JSON as it is, with no objects made at all.
    """

    __slots__ = ("_lists", "logprob_values", "_keep_entries")

    def __init__(self, collect_logprobs: bool = False, keep_entries: bool = True) -> None:
        #: field -> the items of the list so far, comma-joined JSON (the list was seen: never None).
        self._lists: dict[str, bytearray] = {}
        #: With ``collect_logprobs``: each ``logprobs.content`` entry's logprob, as it is parsed
        #: anyway (the token capture mode's entry takes them without parsing the entries again).
        self.logprob_values: array | None = array("d") if collect_logprobs else None
        #: Without: only the floats are kept (``collect_logprobs`` on; see `keep_logprob_entries`).
        self._keep_entries = keep_entries or not collect_logprobs

    def extend(self, field: str, items: list[Any], written: bytes | None = None) -> None:
        """Append ``items``; ``written``: their list's JSON, when someone already wrote it."""
        self.extend_json(field, (written or orjson.dumps(items))[1:-1] if items else b"")

    @property
    def keeps_entries(self) -> bool:
        """The logprob entries' JSON is kept (not only their floats)."""
        return self._keep_entries

    def extend_json(self, field: str, items: bytes) -> None:
        """`extend` with the items already written: their JSON, comma-joined (maybe empty)."""
        kept = self._lists.get(field)
        if kept is None:
            kept = self._lists[field] = bytearray()
        if items:
            if kept:
                kept += b","
            kept += items

    def merge_logprobs(self, current: dict[str, Any] | None, chunk: dict[str, Any],
                       lists: tuple[str, ...] = ("content", "refusal"), written: bytes | None = None) -> dict[str, Any]:
        """A choice's ``logprobs``: the per-token ``lists`` appended (chat: ``content`` and
        ``refusal`` entries, as the SDK does); any other key by the generic rule. ``written``:
        the chunk's JSON when someone already wrote it (vLLM's is ``{"content":[...]}``)."""
        if current is None:
            current = {name: None for name in lists}
        if self.logprob_values is not None:
            self._collect(chunk.get("content"))
            if not self._keep_entries and len(chunk) == 1 and self.logprob_values is not None:
                return current  # The floats are kept; the entries' JSON is nobody's (`keep_logprob_entries`).
        if written is not None and len(chunk) == 1 and written.startswith(b'{"content":[') and written.endswith(b"]}"):
            self.extend("logprobs.content", chunk["content"], written[11:-1])
            return current
        for key, value in chunk.items():
            if key in lists and type(value) is list:
                self.extend("logprobs." + key, value)
            else:
                merge_unknown(current, key, value)
        return current

    def _collect(self, entries: Any) -> None:
        values = self.logprob_values
        if values is None:
            return
        if type(entries) is not list:
            self.logprob_values = None  # Not vLLM's shape: the entry reads the line instead.
            return
        for entry in entries:
            value = entry.get("logprob") if type(entry) is dict else None
            if type(value) is not float and (type(value) is not int or type(value) is bool):
                self.logprob_values = None
                return
            values.append(value)

    def count(self, field: str = "token_ids") -> int | None:
        """How many items a kept list of small ints holds so far (a comma count: no parse), or None."""
        items = self._lists.get(field)
        return None if items is None else (items.count(b",") + 1 if items else 0)

    def ids_json(self, field: str = "token_ids") -> bytes | None:
        """A kept list's items, comma-joined JSON, or None when never seen."""
        items = self._lists.get(field)
        return None if items is None else bytes(items)

    def ids(self, field: str = "token_ids") -> list[Any] | None:
        """A kept list, parsed (the ids: small ints, quick to parse), or None when never seen."""
        items = self._lists.get(field)
        return None if items is None else orjson.loads(b"[" + items + b"]")

    def put_into(self, choice: dict[str, Any], compact: bool) -> dict[str, Any]:
        """A copy of ``choice`` with the kept lists in their places."""
        choice = dict(choice)
        for field, items in self._lists.items():
            value = orjson.Fragment(b"[" + items + b"]") if compact else orjson.loads(b"[" + items + b"]")
            if field.startswith("logprobs."):
                logprobs = choice["logprobs"] = dict(choice["logprobs"] or {})
                logprobs[field[len("logprobs."):]] = value
            else:
                choice[field] = value
        return choice
