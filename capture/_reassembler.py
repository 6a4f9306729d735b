"""What every dialect's reassembler shares: the fold interface and JSON decoding of events."""

from __future__ import annotations

from typing import Any, Callable, Optional

import orjson

from ._event_templates import EventTemplate, Slot, learn_template
from ._sse import ServerSentEvent


#: Pieces of one growing text joined together once this many have arrived (`append_text`).
JOIN_EVERY = 1024


class Reassembler:
    """A fold over one stream's events into the object the non-streaming endpoint returns.

    Subclasses implement `_on_payload`. Errors are data: a bad event is counted, never raised.
    """

    dialect = ""
    #: Give per-token lists as `orjson.Fragment` (the capture line embeds them as they are) rather
    #: than as parsed lists; set by the proxy, whose line is all that reads them.
    compact_arrays = False
    #: JSON the token capture mode's cutter already wrote for a value of the event being folded,
    #: by ``id(value)`` (`AddedFieldCutter.written`): per-token lists reuse it instead of
    #: serialising the same value twice.
    written: dict[int, bytes] | None = None
    #: The token capture mode's arrays (chat's reassembler collects each token's logprob as it is
    #: parsed, `capture._chat`); the other dialects ignore them.
    collect_logprobs = False
    keep_logprob_entries = True

    def __init__(self) -> None:
        #: True once the dialect's terminal event has been seen (docs/files.md).
        self.terminal = False
        #: ``upstream_error`` / ``incomplete`` when the stream itself reported it (docs/files.md).
        self.error_category: str | None = None
        #: Events whose data was not a JSON object.
        self.undecodable_events = 0
        #: Text growing delta by delta, by (id(container), field): (container, field, pieces).
        self._texts: dict[tuple[int, Any], tuple[dict[Any, Any], Any, list[str]]] = {}

    #: Choices the request asked for (``n``) and whether it asked a usage chunk
    #: (``stream_options.include_usage``): what `seen_whole` waits for (`expect`).
    expected_choices = 1
    wants_usage = False
    #: The reply ends at its last meaningful event (`seen_whole`), not at the terminal after it
    #: (chat's ``[DONE]``, Messages' ``message_stop``): set by `StreamTap` when the request says
    #: what that event is (docs/wire.md, "Durable before the agent's end"). The line is made
    #: there and the chunk completing that event is the one held until it is durable.
    ends_when_whole = False

    def expect(self, request: Any) -> None:
        """What the request asked for that ends the reply before its terminal (docs/wire.md)."""
        if type(request) is not dict:
            return
        n = request.get("n")
        if type(n) is int and n > 1:
            self.expected_choices = n
        options = request.get("stream_options")
        self.wants_usage = type(options) is dict and options.get("include_usage") is True

    def seen_whole(self) -> bool:
        """The reply's last meaningful event has come: a client that leaves now, before the
        terminal (chat's ``[DONE]``), has had all of it. The terminal, unless a dialect says more."""
        return self.terminal

    def _ended_if_whole(self) -> None:
        """After an event that may complete the reply (a finish reason, the usage chunk, Messages'
        stop reason): with `ends_when_whole`, the reply ends here when it is whole."""
        if self.ends_when_whole and not self.terminal and self.seen_whole():
            self.terminal = True

    def _choices_seen_whole(self, choices: list[Any], usage: Any, error: Any) -> bool:
        """Chat's and completions' rule: every choice asked for has its ``finish_reason`` and,
        where the request asked, the usage chunk has come (docs/wire.md): what follows is ``[DONE]``,
        which some clients (Codex CLI's chat wire) do not wait for."""
        return self.terminal or (
            error is None and len(choices) >= self.expected_choices
            and all(choice is not None and choice["finish_reason"] is not None for choice in choices)
            and (not self.wants_usage or usage is not None))

    def generated_so_far(self) -> dict[int, int] | None:
        """Per choice: the generated token ids that have streamed so far (vLLM's ``token_ids``),
        for placing a declared weight update (issue 32); None when the stream does not carry
        them. Counted when asked, never per event."""
        arrays = getattr(self, "_arrays", None)
        if not arrays:
            return None
        counts = {index: kept.count() for index, kept in arrays.items()}
        return counts if all(count is not None for count in counts.values()) else None

    def feed_event(self, event: ServerSentEvent) -> None:
        """Fold one event into the state; events after the terminal are not part of the reply."""
        if self.terminal:
            return
        try:
            payload = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            payload = None
        if type(payload) is not dict:
            self._on_undecodable(event)
            return
        self._fold(event.event, payload)

    def feed_data(self, event_type: str, data: bytes) -> None:
        """`feed_event` for an event given as its type and raw data (`SSEParser.feed_plain`).

        The bytes go to the JSON parser as they are, without first becoming text; anything that
        is not a JSON object in valid UTF-8 takes `feed_event`'s path, so the outcome is the same.
        """
        if self.terminal:
            return
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            payload = None
        if type(payload) is not dict:
            self.feed_event(ServerSentEvent(event_type, data.decode("utf-8", "replace")))
            return
        self._fold(event_type, payload)

    def fold_plain(self, events: list[tuple[str, bytes, bytes]]) -> None:
        """`feed_data` for each of the plain events of one read (`SSEParser.feed_plain`); a dialect
        with a hot event folds them in one loop of its own (`ChatReassembler.fold_plain`)."""
        for event_type, data, _ in events:
            self.feed_data(event_type, data)

    def feed_payload(self, event_type: str, payload: dict[str, Any]) -> None:
        """`feed_data` for an event whose data the caller already parsed (a JSON object)."""
        if not self.terminal:
            self._fold(event_type, payload)

    def _fold(self, event_type: str, payload: dict[str, Any]) -> None:
        # The event name decides; a stream without names (or a proxy that drops them) falls back
        # to the payload's `type`, which every dialect sets to the same value (docs/files.md).
        if event_type == "message" and isinstance(payload.get("type"), str):
            event_type = payload["type"]
        self._on_payload(event_type, payload)

    def result(self) -> dict[str, Any] | None:
        """The reassembled object: final after the terminal event, else the best partial one."""
        raise NotImplementedError

    def learn_template(self, prefix: bytes, data: bytes, payload: Any = None, event_type: str = "message"
                       ) -> Optional[tuple[EventTemplate, bytes, dict[str, Any], list[bytes]]]:
        """The template of an event just folded whose runs this dialect folds at once
        (`capture._event_templates`), or None (the default: every event is parsed)."""
        return None

    def template_payload(self, data: bytes, payload: Any) -> Optional[dict[str, Any]]:
        """An event's data as the JSON object a template is learnt from (``payload``: parsed
        already, or None), or None: not an object, or the stream has ended."""
        if self.terminal:
            return None
        if payload is None:
            try:
                payload = orjson.loads(data)
            except orjson.JSONDecodeError:
                return None
        return payload if type(payload) is dict else None

    def _text_template(self, prefix: bytes, data: bytes, payload: Any, event_type: str,
                       slots: Callable[[str, dict[str, Any]], Optional[tuple[list[Slot], Callable[[str], None]]]]
                       ) -> Optional[tuple[EventTemplate, bytes, dict[str, Any], list[bytes]]]:
        """`learn_template` for an event whose fold appends one text: ``slots(event_type, payload)``
        gives its slots (the text's named ``text``; others only checked) and what takes the
        run's text joined, or None when the event is not such an event in this state."""
        payload = self.template_payload(data, payload)
        if payload is None:
            return None
        if event_type == "message" and isinstance(payload.get("type"), str):
            event_type = payload["type"]  # As `_fold` resolves it.
        found = slots(event_type, payload)
        if found is None:
            return None
        learnt = learn_template(prefix, data, payload, found[0])
        if learnt is None:
            return None
        template, take_text = learnt[0], found[1]
        text = template.names.index("text")

        def fold(columns: list[list[bytes]], count: int, decoded: list[Any]) -> None:
            take_text(decoded[text])

        template.fold = fold
        return learnt

    def append_text(self, container: dict[Any, Any], field: Any, piece: str) -> list[str]:
        """``container[field] += piece`` (a value that is not text is replaced), in time linear in
        the piece: the pieces are joined once, by `join_texts`. Concatenating per delta copies
        the whole text each time, quadratic in a long reasoning stream of tens of thousands of
        deltas. Until `join_texts`, ``container[field]`` holds the first piece.

        Returns the text's list of pieces: a hot fold may append the next pieces to it itself while
        it holds fewer than ``JOIN_EVERY - 1`` (`ChatReassembler._on_payload`)."""
        key = (id(container), field)
        entry = self._texts.get(key)
        if entry is None:
            current = container.get(field)
            container[field] = current if type(current) is str else piece
            pieces = [current, piece] if type(current) is str else [piece]
            self._texts[key] = (container, field, pieces)
        else:
            pieces = entry[2]
            pieces.append(piece)
            if len(pieces) >= JOIN_EVERY:
                # A piece per token is ~60 bytes of objects for ~4 bytes of text: joined now and
                # then, a 32k-token stream's text stays near its own size (amortised linear).
                pieces[:] = ["".join(pieces)]
        return pieces

    def set_text(self, container: dict[Any, Any], field: Any, value: Any) -> None:
        """``container[field] = value``, discarding pieces not yet joined (a ``done`` event's whole text)."""
        self._texts.pop((id(container), field), None)
        container[field] = value

    def join_texts(self) -> None:
        """Put every text built by `append_text` in its place; `result` calls it first."""
        for container, field, pieces in self._texts.values():
            if len(pieces) > 1:
                pieces[:] = ["".join(pieces)]
            container[field] = pieces[0]

    def _on_payload(self, event_type: str, payload: dict[str, Any]) -> None:
        raise NotImplementedError

    #: ``data: [DONE]`` ends the stream (chat, completions); elsewhere it is only tolerated.
    done_is_terminal = False

    def _on_undecodable(self, event: ServerSentEvent) -> None:
        # OpenAI-compatible servers (OpenRouter) end Responses streams with Chat's `[DONE]` too.
        if event.data.strip() != "[DONE]":
            self.undecodable_events += 1
        elif self.done_is_terminal:
            self.terminal = True


def grow_list(items: list[Any], index: Any, filler: Any = None) -> bool:
    """Make ``items[index]`` addressable; False when ``index`` is not a sane list index."""
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 100_000:
        return False
    while len(items) <= index:
        items.append(filler() if callable(filler) else filler)
    return True
