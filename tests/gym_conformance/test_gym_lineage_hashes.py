"""`records`' lineage hashes equal NeMo Gym 0.7.0's (issue 31, point 2): `assistant_fingerprint` and
`conversation_digest` of the same requests, in every dialect's shape, computed by Gym's own
``nemo_gym.token_id_capture.fingerprint`` in its venv and by ours; the errors agree too."""

from __future__ import annotations

import json
import subprocess


from tests.gym_conformance.gym_token_capture import FINDER
from records.contract.reading import assistant_fingerprint, conversation_digest


_CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"b": 2, "a": 1}'}}
#: Requests as agents send them: Chat, Responses input, Anthropic messages, and the odd shapes.
CONVERSATIONS = {
    "chat root": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "chat two turns": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                       {"role": "user", "content": "Add 1 and 2"}],
    "chat tool call and result": [{"role": "user", "content": "Add"}, {"role": "assistant", "content": None,
                                                                      "tool_calls": [_CALL]},
                                  {"role": "tool", "tool_call_id": "call_1", "content": "3"}],
    "chat arguments re-serialised": [{"role": "user", "content": "Add"}, {"role": "assistant", "content": "",
                                      "tool_calls": [{**_CALL, "function": {"name": "add", "arguments": '{"a":1,"b":2}'}}]},
                                     {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "3"}]}],
    "chat content parts": [{"role": "user", "content": [{"type": "text", "text": "look"},
                                                        {"type": "image_url", "image_url": {"url": "data:x"}}]},
                           {"role": "assistant", "content": [{"type": "text", "text": "a cat"}, "plain"]}],
    "responses items": [{"role": "user", "content": [{"type": "input_text", "text": "Add"}]},
                        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
                        {"type": "function_call", "call_id": "fc_1", "name": "add", "arguments": '{"a": 1, "b": 2}'},
                        {"type": "function_call_output", "call_id": "fc_1", "output": "3"},
                        {"type": "message", "role": "assistant",
                         "content": [{"type": "output_text", "text": "It is 3."}]}],
    "responses namespaced tool": [{"type": "function_call", "call_id": "fc_2", "namespace": "math", "name": "add",
                                   "arguments": "not json "}],
    "anthropic tool use": [{"role": "user", "content": "Add"},
                           {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                                             {"type": "text", "text": "Sure."},
                                                             {"type": "tool_use", "id": "tu_1", "name": "add",
                                                              "input": {"b": 2, "a": 1}}]},
                           {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "tu_1",
                                                         "content": [{"type": "text", "text": "3"}]}]}],
    "unicode and empties": [{"role": "user", "content": ""}, {"role": "assistant", "content": "caf\u00e9 \U0001F600"},
                            {"role": "assistant", "content": []}],
    "not an object": [{"role": "user", "content": "x"}, "stray"],
    "block without a type": [{"role": "assistant", "content": [{"image": 1}]}],
    "content of a number": [{"role": "user", "content": 7}],
    "integers at orjson's bounds": [{"role": "assistant", "content": None, "tool_calls": [
        {**_CALL, "function": {"name": "add", "arguments": f'{{"a": {2 ** 64 - 1}, "b": {-(2 ** 63)}}}'}}]}],
}

#: vLLM 0.32's `chat-tools-bigint` shape: an integer past 64 bits, which Gym's orjson refuses.
_BIG = 173231922049322000000424173031616488132980432643411327825177819722106464602787833241280021910033315808048588533240102217150307991017899993215

_GYM_SCRIPT = FINDER + """
import json, sys
_fingerprint = gym_token_capture("fingerprint")
assistant_fingerprint, conversation_digest = _fingerprint.assistant_fingerprint, _fingerprint.conversation_digest
out = {}
for name, messages in json.load(sys.stdin).items():
    try:
        out[name] = [assistant_fingerprint(messages), conversation_digest(messages)]
    except ValueError as error:
        out[name] = ["error", str(error)]
print(json.dumps(out))
"""


def _ours(messages: list) -> list[str]:
    try:
        return [assistant_fingerprint(messages), conversation_digest(messages)]
    except ValueError as error:
        return ["error", str(error)]


def test_the_hashes_are_gyms(gym):
    done = subprocess.run([gym, "-c", _GYM_SCRIPT], input=json.dumps(CONVERSATIONS), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout)
    for name, messages in CONVERSATIONS.items():
        assert _ours(messages) == theirs[name], name


def test_what_the_hashes_tell_apart():
    """Re-serialised arguments and reasoning items hash alike; a changed tool result does not."""
    chat = CONVERSATIONS["chat tool call and result"]
    assert assistant_fingerprint(chat) == assistant_fingerprint(CONVERSATIONS["chat arguments re-serialised"])
    assert assistant_fingerprint(CONVERSATIONS["chat root"]) == ""
    changed = [*chat[:2], {**chat[2], "content": "4"}]
    assert assistant_fingerprint(changed) == assistant_fingerprint(chat)
    assert conversation_digest(changed) != conversation_digest(chat)


def _bigint_call(arguments: str) -> list:
    return [{"role": "user", "content": "add"},
            {"role": "assistant", "content": "", "tool_calls": [{**_CALL, "function": {"name": "add", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "x"}]


def test_an_integer_beyond_64_bits_hashes_as_json_writes_it():
    """Gym's hashes refuse it (its orjson cannot write it: Gym abstains from fingerprinting that
    output); ours write its exact digits, as `json` does, so the call keeps its entry and the next
    turn finds it. Re-serialised arguments still hash alike; one digit more does not."""
    from records.contract.reading import canonical_arguments

    spaced = f'{{"a": 0, "b": {_BIG}}}'
    assert canonical_arguments(spaced) == json.dumps(json.loads(spaced), sort_keys=True, separators=(",", ":"))
    assert canonical_arguments(f'{{"b":{_BIG},"a":0}}') == canonical_arguments(spaced)
    assert canonical_arguments({"a": [-_BIG, {"z": _BIG, "y": 1.5}]}) == f'{{"a":[-{_BIG},{{"y":1.5,"z":{_BIG}}}]}}'
    ours = assistant_fingerprint(_bigint_call(spaced))
    assert ours and ours == assistant_fingerprint(_bigint_call(f'{{"b":{_BIG},"a":0}}'))
    assert ours != assistant_fingerprint(_bigint_call(f'{{"a": 0, "b": {_BIG}0}}'))
    assert conversation_digest(_bigint_call(spaced)) != conversation_digest(_bigint_call(f'{{"a": 0, "b": {_BIG}0}}'))


def test_gym_refuses_to_hash_such_an_integer(gym):
    """Why ours extends Gym's here rather than matching it: Gym raises (so its own model server
    writes that output's entry without a fingerprint). Everything Gym can hash hashes alike
    (`test_the_hashes_are_gyms`)."""
    messages = {"big": _bigint_call(f'{{"a": 0, "b": {_BIG}}}')}
    done = subprocess.run([gym, "-c", _GYM_SCRIPT], input=json.dumps(messages), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["big"] == ["error", "unsupported prompt content: dict"]
