#!/usr/bin/env python3
"""Writes a checkpoint of random bf16 tensors in the Qwen3-0.6B layout (hidden
1024, 28 layers, MLP 3072, 16 q / 8 kv heads of 128, vocabulary 151936,
untied lm_head), for the benchmarks.
Usage: make_checkpoint.py DIR [qwen|big] [SEED]
  qwen  two shards, 1.5 GB (default)
  big   one shard of about 6 GB: the same with six times the layers
SEED, when given, is written into the config and ahead of the first tensor's
bytes, so that every checkpoint of a series is new content."""
import json, os, struct, sys

out = sys.argv[1]
layout = sys.argv[2] if len(sys.argv) > 2 else "qwen"
seed = int(sys.argv[3]) if len(sys.argv) > 3 else None
d, layers, mlp, vocab = 1024, 28, 3072, 151936
layer = [("self_attn.q_proj.weight", [2048, d]), ("self_attn.k_proj.weight", [1024, d]),
         ("self_attn.v_proj.weight", [1024, d]), ("self_attn.o_proj.weight", [d, 2048]),
         ("self_attn.q_norm.weight", [128]), ("self_attn.k_norm.weight", [128]),
         ("mlp.gate_proj.weight", [mlp, d]), ("mlp.up_proj.weight", [mlp, d]),
         ("mlp.down_proj.weight", [d, mlp]), ("input_layernorm.weight", [d]),
         ("post_attention_layernorm.weight", [d])]
count = layers * (6 if layout == "big" else 1)
tensors = [("model.embed_tokens.weight", [vocab, d])]
tensors += [(f"model.layers.{i}.{name}", shape) for i in range(count) for name, shape in layer]
tensors += [("model.norm.weight", [d]), ("lm_head.weight", [vocab, d])]
half = len(tensors) // 2
shards = [tensors] if layout == "big" else [tensors[:half], tensors[half:]]
os.makedirs(out, exist_ok=True)
for s, part in enumerate(shards):
    header, off = {}, 0
    for name, shape in part:
        n = 2
        for x in shape: n *= x
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode(); h += b" " * (-len(h) % 8)
    with open(os.path.join(out, f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h)
        left = off
        if seed is not None:
            f.write(struct.pack("<Q", seed)); left -= 8
        for _ in range(left >> 24): f.write(os.urandom(1 << 24))
        f.write(os.urandom(left & ((1 << 24) - 1)))
config = {"model_type": "qwen3"}
if seed is not None: config["seed"] = seed
with open(os.path.join(out, "config.json"), "w") as f: json.dump(config, f)
