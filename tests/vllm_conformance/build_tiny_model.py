"""Build the tiny random-weight model vLLM serves in this tier; run with the vLLM venv's Python.

No model hub is reachable, so everything is made here: a byte-level BPE tokenizer (3,072 ids)
trained on the first 200 ``*.py`` files of the Python standard library, with ChatML specials and
hermes-style ``<tool_call>`` tags; a ChatML chat template with a tools section (close to
Qwen2.5's); a Qwen2 model with hidden size 128 and 2 layers, random weights from a fixed seed.
The text it writes is nonsense; the wire format is vLLM's own, which is what the tier tests.

    python build_tiny_model.py OUT_DIR
"""

import glob
import json
import os
import sys
import sysconfig

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|pad|>"]
VOCABULARY = 3072
TEMPLATE = r"""{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}
{% endif %}# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Return each function call as a JSON object with name and arguments within <tool_call></tool_call> tags.<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}{%- for message in messages %}{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{% if message.content %}{{ message.content }}{% endif %}{% for tc in message.tool_calls or [] %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {% if tc.function.arguments is string %}{{ tc.function.arguments }}{% else %}{{ tc.function.arguments | tojson }}{% endif %}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def build(out: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(out, exist_ok=True)
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:200]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train(files, trainers.BpeTrainer(vocab_size=VOCABULARY - len(SPECIALS), special_tokens=[],
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                               show_progress=False))
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(os.path.join(out, "tokenizer.json"))
    ids = tokenizer.get_vocab()
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
                   "pad_token": "<|pad|>", "unk_token": None, "model_max_length": 4096, "chat_template": TEMPLATE,
                   "added_tokens_decoder": {str(ids[s]): {"content": s, "special": True, "lstrip": False, "rstrip": False,
                                                          "normalized": False, "single_word": False} for s in SPECIALS}},
                  handle, indent=1)

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCABULARY, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         initializer_range=0.2, eos_token_id=ids["<|im_end|>"], bos_token_id=ids["<|endoftext|>"],
                         pad_token_id=ids["<|pad|>"], tie_word_embeddings=True, torch_dtype="float32")
    Qwen2ForCausalLM(config).save_pretrained(out, safe_serialization=True)


if __name__ == "__main__":
    build(sys.argv[1])
