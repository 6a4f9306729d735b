"""What a trainer computes from a rollout's trajectory, with the served model's own weights: run with
the vLLM venv's Python (it has torch and transformers), never imported by the project.

    python recompute_logprobs.py MODEL_DIR IN.json OUT.json

IN.json: ``{"sequences": [{"id", "token_ids"}], "conversations": [{"id", "messages", "tools"}]}``.
OUT.json: ``{"logprobs": {id: [None, lp_1, ...]}, "rendered": {id: [ids]}}``: for each sequence the
log-probability of each token given the ones before it (a forward pass in fp32, the log-softmax of
the logits: what vLLM reports as ``raw_logprobs``, and what a policy-gradient loss reads), and for
each conversation the ids a trainer that re-renders it with the chat template would train on.
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(model_dir: str, source: str, target: str) -> None:
    with open(source, encoding="utf-8") as handle:
        asked = json.load(handle)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    logprobs = {}
    with torch.no_grad():
        for sequence in asked["sequences"]:
            ids = torch.tensor([sequence["token_ids"]], dtype=torch.long)
            logits = model(ids).logits[0].to(torch.float32)
            scores = torch.log_softmax(logits[:-1], dim=-1).gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1)
            logprobs[sequence["id"]] = [None, *(float(score) for score in scores)]
    rendered = {}
    for conversation in asked["conversations"]:
        rendered[conversation["id"]] = list(tokenizer.apply_chat_template(
            conversation["messages"], tools=conversation.get("tools"), tokenize=True, add_generation_prompt=False))
    with open(target, "w", encoding="utf-8") as handle:
        json.dump({"logprobs": logprobs, "rendered": rendered}, handle)


if __name__ == "__main__":
    main(*sys.argv[1:4])
