"""What the tap captured, compared across taps with and without the token capture mode's cutter."""

from __future__ import annotations

import dataclasses

from capture import CuttingStreamTap, StreamTap, TapOutcome


def outcome_with_cut_entries(tap: StreamTap) -> TapOutcome:
    """The tap's outcome, with the logprob entries it did not keep (the agent did not ask for
    them: only their floats are kept, issue 34) put back from those floats, as the reference
    tap without a cutter has them -- compared by their logprobs."""
    collected = tap.collected_arrays() if isinstance(tap, CuttingStreamTap) and tap.cutter.cuts_logprobs else None
    outcome = tap.finish(200)
    response = outcome.response
    if not collected or not isinstance(response, dict) or response.get("object") != "chat.completion":
        return outcome
    return dataclasses.replace(outcome, response={**response, "choices": [
        {**choice, "logprobs": {**choice["logprobs"], "content": _EntriesOf(collected[choice["index"]][1])}}
        if choice["index"] in collected and choice.get("logprobs") else choice for choice in response["choices"]]})


class _EntriesOf(list):
    """Logprob entries compared by their logprob values only."""

    def __eq__(self, other):
        return isinstance(other, list) and list(self) == [entry.get("logprob") for entry in other]


