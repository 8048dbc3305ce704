"""Writes a small Llama-architecture Hugging Face model folder with random weights and a real tokenizer.

Used by `cargo xtask engines vllm` to give vLLM's tests and benches a model that needs no download: its
text is nonsense, but vLLM's tokenisation, chat templating, prefill, paged KV cache, prefix caching, KV
events and metrics are the real thing. Everything is made here, from a seed:

- a byte-level BPE tokenizer (the `tokenizers` package), trained on text generated from a fixed word
  list, with Llama 3's special tokens (`<|begin_of_text|>`, `<|start_header_id|>`, `<|end_header_id|>`,
  `<|eot_id|>`, `<|end_of_text|>`), a post-processor that puts the BOS token first (as Llama 3's does)
  and a Llama-3-style chat template in `tokenizer_config.json`;
- a `LlamaConfig` model (transformers) with random weights, saved as bf16 safetensors.

The same arguments always give the same files.

usage: python tiny_llama_hf.py OUT_DIR [--vocab N] [--hidden N] [--layers N] [--ff N] [--heads N]
       [--ctx N] [--seed N]
"""

import argparse
import json
import os
import random
import shutil
import sys

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
EOT = "<|eot_id|>"
START = "<|start_header_id|>"
END = "<|end_header_id|>"
SPECIAL = [BOS, EOS, START, END, EOT]

# Llama 3's template in shape: BOS, then per message a header with the role, two newlines, the trimmed
# content and <|eot_id|>; the assistant header when a generation prompt is asked for.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

WORDS = (
    "the a an of to in on for with by from at as is are was be been has have had do does not no yes and or "
    "but if then else when while where which who what why how this that these those it its they them their "
    "we our you your he she his her i me my fleet router replica cache block token prefix request reply "
    "model engine server client stream chat system user assistant rule policy metric latency queue load "
    "memory compute prompt answer question time first second third last next every each some many few more "
    "most less least good bad fast slow warm cold hit miss store remove clear event batch sequence number "
    "value table index key hash chain node tree page data file path line word text code test check run build "
    "keeps says holds sends reads writes makes takes gives finds shows knows picks routes serves waits starts "
    "stops moves grows falls rises one two three four five six seven eight nine ten hundred thousand"
).split()


def corpus(seed: int, lines: int) -> list:
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 18))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 100000)))
        sentence = " ".join(words)
        if rng.random() < 0.5:
            sentence = sentence.capitalize()
        out.append(sentence + rng.choice([".", "?", "!", ",", ":", ";", ""]))
        if i % 7 == 0:
            out.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789_-/()[]{}\"'#*+=<>") for _ in range(40)))
    return out


def build_tokenizer(vocab: int, seed: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed, 20000), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the model folder to write")
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--ff", type=int, default=384)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=34)
    args = parser.parse_args()
    if args.hidden % args.heads != 0:
        print(f"--hidden {args.hidden} must be a multiple of --heads {args.heads}", file=sys.stderr)
        return 2

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tmp = args.out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)

    raw = build_tokenizer(args.vocab, args.seed)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=BOS,
        eos_token=EOT,
        pad_token=EOS,
        model_max_length=args.ctx,
        chat_template=CHAT_TEMPLATE,
    )
    tokenizer.save_pretrained(tmp)
    # transformers 5 may write the template to chat_template.jinja only; keep it in tokenizer_config.json
    # too, where vLLM, fleet-router and most servers look first.
    config_path = os.path.join(tmp, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["chat_template"] = CHAT_TEMPLATE
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)

    torch.manual_seed(args.seed)
    model_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.hidden,
        intermediate_size=args.ff,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=args.ctx,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=[tokenizer.convert_tokens_to_ids(EOT), tokenizer.convert_tokens_to_ids(EOS)],
        pad_token_id=tokenizer.convert_tokens_to_ids(EOS),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(model_config).to(torch.bfloat16)
    model.save_pretrained(tmp, safe_serialization=True)

    shutil.rmtree(args.out, ignore_errors=True)
    os.rename(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
