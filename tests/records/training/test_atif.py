"""`records.to_atif` and `mcc export --format atif` (docs/reading.md, "ATIF"): a rollout as one ATIF v1.7
trajectory, steps in the order the agent saw them, tool results as observations of the step whose
call they answer, token ids and logprobs where captured, sub-agents as trajectories of their own.
(Gym 0.7.0's own strict models validate these documents in tests/gym_conformance.)"""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from proxy import main
from records import Captures, read_token_records, to_atif

from tests.records.training.atif_runs import make_atif_dir


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("atif"))
    make_atif_dir(path)
    return path


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_a_tool_calling_turn_reads_in_order_with_its_observation(run, dialect):
    document = to_atif(run, f"conv-{dialect}")
    assert document["schema_version"] == "ATIF-v1.7" and document["session_id"] == f"conv-{dialect}"
    steps = document["steps"]
    assert [step["step_id"] for step in steps] == list(range(1, len(steps) + 1))
    system, user, earlier, reply = steps[:4]
    assert (system["source"], system["message"]) == ("system", "You are terse.")
    assert (user["source"], user["message"]) == ("user", "Weather in Paris?")
    assert earlier["source"] == "agent" and earlier["is_copied_context"] is True, "history no captured reply made"
    (call,) = earlier["tool_calls"]
    assert (call["function_name"], call["arguments"]) == ("search", {"q": "paris"})
    (result,) = earlier["observation"]["results"]
    assert (result["source_call_id"], result["content"]) == (call["tool_call_id"], "18 C and sunny")
    assert reply["message"] == "Checking the forecast." and reply["reasoning_content"] == "The user wants tomorrow too."
    assert [(c["function_name"], c["arguments"]) for c in reply["tool_calls"]] == [("forecast", {"city": "Paris"})]
    assert reply["metrics"]["prompt_tokens"] == 40 and reply["metrics"]["completion_tokens"] == 12
    assert reply["extra"]["model_call_id"] == f"{dialect}-0" and reply["timestamp"] == "2026-01-01T00:00:00Z"
    # The cut stream and the 429 that followed: agent steps of their own, their outcome said.
    assert [step["extra"].get("error_category") for step in steps[4:]] == ["stream_truncated", "rate_limit"]
    assert document["final_metrics"]["total_steps"] == len(steps)


def test_the_token_modes_arrays_are_the_steps_token_ids_and_logprobs(run):
    document = to_atif(run, "rl-00000")
    agent = [step for step in document["steps"] if step["source"] == "agent" and not step.get("is_copied_context")]
    records = [record for record in read_token_records(run, "rl-00000") if record.choice_index == 0]
    assert len(agent) == len(records) == 3
    for step, record in zip(agent, records):
        assert step["metrics"]["prompt_token_ids"] == record.prompt_token_ids
        assert step["metrics"]["completion_token_ids"] == record.generation_token_ids
        assert step["metrics"]["logprobs"] == record.generation_log_probs
    assert [step["source"] for step in document["steps"]][:2] == ["user", "agent"]
    assert any(step["source"] == "user" and step["message"] == "tool says t" for step in document["steps"]), \
        "the turn each request added since the last reply"


def test_a_sub_agent_is_a_trajectory_of_its_own(run):
    document = to_atif(run, "agents")
    assert [step["message"] for step in document["steps"]] == ["Plan it.", "Delegating."]
    (sub,) = document["subagent_trajectories"]
    assert sub["trajectory_id"] == "agents/scout" and sub["agent"]["name"] == "model-call-capture/scout"
    assert [step["message"] for step in sub["steps"]] == ["Find the file.", "src/a.py"]
    assert sub["agent"]["model_name"] == "small"


def test_mcc_export_writes_one_document_a_line_as_records_does(run, tmp_path):
    output = str(tmp_path / "run.atif.jsonl")
    done = CliRunner().invoke(main, ["export", run, "--format", "atif", "-o", output], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    documents = [orjson.loads(line) for line in open(output, "rb")]
    ids = Captures(run).rollout_ids()
    assert [document["session_id"] for document in documents] == ids
    assert done.output.strip().endswith(f"{len(ids)} ATIF trajectories")
    expected = to_atif(run, ids[0], agent_version=documents[0]["agent"]["version"])
    assert documents[0] == orjson.loads(orjson.dumps(expected))


def test_a_rollout_with_no_readable_call_says_so(tmp_path):
    (tmp_path / "empty.capture.jsonl").write_bytes(b'{"torn')
    with pytest.raises(ValueError, match="no readable call"):
        to_atif(str(tmp_path), "empty")


def test_an_ended_rollouts_outcome_is_the_documents_root_extra(run):
    from records import end_rollout

    assert "extra" not in to_atif(run, "rl-00000"), "no end, no outcome"
    end = end_rollout(run, "rl-00000", outcome={"reward": 0.5, "metrics": {"passed": 2}}, group="task-rl")
    document = to_atif(run, "rl-00000")
    assert document["extra"] == {"outcome": {"reward": 0.5, "metrics": {"passed": 2}}, "ended_at": end.ended_at,
                                 "group": "task-rl"}
