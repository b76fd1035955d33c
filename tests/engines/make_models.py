#!/usr/bin/env python3
"""Builds the engines tests' checkpoints: a tiny Qwen3 and its fine-tune.

    make_models.py OUT_DIR

OUT_DIR/base: Qwen3 with hidden size 256 and 2 layers, float32, saved with
transformers' save_pretrained in shards of at most 1 MB, with a 512-token
byte-level BPE tokenizer trained with `tokenizers`. OUT_DIR/finetune: the
same files, except that model.norm.weight differs (its shard's header is
byte for byte the base's: same names, dtypes, shapes and offsets), as a
fine-tune of one tensor is. Made again only when this script changes (its
hash is in OUT_DIR/.ckptfs-ready).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import sys

VOCAB = 512
WORDS = ("the model loads weights from a mount named by the digest of every byte so a fine tune and its base "
         "never share a name cache key or path tokens are counted and checked before they are served").split()


def corpus(lines: int = 2000):
    import random
    rng = random.Random(0)
    for _ in range(lines):
        yield " ".join(rng.choice(WORDS) for _ in range(12))


def make_tokenizer(out: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(out)
    return fast


def make_base(out: str) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1234)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                         tie_word_embeddings=False, eos_token_id=0, bos_token_id=0, pad_token_id=0,
                         torch_dtype="float32")
    model = Qwen3ForCausalLM(config).to(torch.float32)
    with torch.no_grad():  # random norms, so that one changed norm changes every logit
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.randn_like(p))
    model.save_pretrained(out, max_shard_size="1MB", safe_serialization=True)
    make_tokenizer(out)


def shard_of(checkpoint: str, tensor: str) -> str:
    with open(os.path.join(checkpoint, "model.safetensors.index.json")) as f:
        return os.path.join(checkpoint, json.load(f)["weight_map"][tensor])


def rewrite_tensor(path: str, tensor: str, transform) -> None:
    """Replaces one tensor's bytes in place; the header is left as it is."""
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        begin, end = header[tensor]["data_offsets"]
        f.seek(8 + n + begin)
        old = f.read(end - begin)
        new = transform(old)
        assert len(new) == len(old)
        f.seek(8 + n + begin)
        f.write(new)


def make_finetune(base: str, out: str) -> None:
    import numpy as np
    shutil.copytree(base, out)
    tensor = "model.norm.weight"

    def scaled(raw: bytes) -> bytes:
        return (np.frombuffer(raw, dtype=np.float32) * 1.5 + 0.25).astype(np.float32).tobytes()

    rewrite_tensor(shard_of(out, tensor), tensor, scaled)


def main() -> None:
    out = sys.argv[1]
    with open(__file__, "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    stamp = os.path.join(out, ".ckptfs-ready")
    if os.path.exists(stamp) and open(stamp).read() == want:
        return
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    make_base(os.path.join(out, "base"))
    make_finetune(os.path.join(out, "base"), os.path.join(out, "finetune"))
    with open(stamp, "w") as f:
        f.write(want)


if __name__ == "__main__":
    main()
