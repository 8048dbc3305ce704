"""Writes a small Llama-architecture GGUF with random weights and a real vocabulary.

Used by `cargo xtask engines llamacpp` to give the real-engine tests and `cargo xtask bench real` a
model that needs no download: its text is nonsense, but llama-server's prefill, KV cache, prompt
caching, slots, metrics and usage are the real thing. The tokenizer (every `tokenizer.*` key) is
copied from one of the vocabulary-only GGUF files llama.cpp ships under `models/`; the weights are
drawn from a seeded generator, so the same arguments always give the same file.

usage: python3 tiny_llama_gguf.py VOCAB_GGUF OUT_GGUF [--embd N] [--layers N] [--ff N] [--heads N]
       [--ctx N] [--seed N]
"""

import argparse
import os
import sys

import numpy as np

import gguf


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vocab", help="a vocabulary-only GGUF (llama.cpp/models/ggml-vocab-*.gguf)")
    parser.add_argument("out", help="where to write the model")
    parser.add_argument("--embd", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--ff", type=int, default=768)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=24)
    args = parser.parse_args()
    if args.embd % args.heads != 0:
        print(f"--embd {args.embd} must be a multiple of --heads {args.heads}", file=sys.stderr)
        return 2

    reader = gguf.GGUFReader(args.vocab)
    if reader.fields["general.architecture"].contents() != "llama":
        print(f"{args.vocab} is not a llama vocabulary", file=sys.stderr)
        return 2
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    n_vocab = len(tokens)

    tmp = args.out + ".partial"
    writer = gguf.GGUFWriter(tmp, "llama")
    writer.add_name(f"fleetdeck-tiny-llama-{args.embd}x{args.layers}")
    writer.add_context_length(args.ctx)
    writer.add_embedding_length(args.embd)
    writer.add_block_count(args.layers)
    writer.add_feed_forward_length(args.ff)
    writer.add_head_count(args.heads)
    writer.add_head_count_kv(args.heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(args.embd // args.heads)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub_type)

    rng = np.random.default_rng(args.seed)

    def weight(*shape: int) -> np.ndarray:
        # Small random values keep activations finite through every layer.
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones(args.embd, dtype=np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, args.embd))
    writer.add_tensor("output_norm.weight", norm())
    writer.add_tensor("output.weight", weight(n_vocab, args.embd))
    for i in range(args.layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        for part in ("q", "k", "v", "output"):
            writer.add_tensor(f"blk.{i}.attn_{part}.weight", weight(args.embd, args.embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(args.ff, args.embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(args.ff, args.embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(args.embd, args.ff))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, args.out)
    per_layer = 4 * args.embd * args.embd + 3 * args.embd * args.ff
    print(
        f"wrote {args.out}: vocab {n_vocab}, {args.layers} layers x {per_layer} weights, "
        f"{2 * n_vocab * args.embd} embedding/output weights"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
