"""vllm.LLM through the mount with load_format="ckptfs": greedy tokens and
logprobs equal to vLLM's own load of the same bytes from the source
directory, for the base and for its fine-tune, different between them;
and the engine's log names each digest and where it came from.

Each engine runs in its own process (as `vllm serve` would), on CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Dict, List, Tuple

import pytest

from conftest import digest_of

PROMPTS = ["the model loads weights from", "a fine tune and its base", "tokens are counted"]

GENERATE = textwrap.dedent("""
    import gc, json, sys
    from vllm import LLM, SamplingParams
    load_format, models = sys.argv[1], sys.argv[2:]
    prompts = json.loads(__import__("os").environ["PROMPTS"])
    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=1, seed=0)
    for model in models:
        llm = LLM(model=model, load_format=load_format, dtype="float32", enforce_eager=True, max_model_len=128,
                  max_num_seqs=4, seed=0, kv_cache_memory_bytes=64 << 20)
        out = []
        for o in llm.generate(prompts, params, use_tqdm=False):
            c = o.outputs[0]
            out.append({"tokens": list(c.token_ids),
                        "logprobs": [step[t].logprob for step, t in zip(c.logprobs, c.token_ids)]})
        print("RESULT " + json.dumps({"model": model, "outputs": out}), flush=True)
        del llm
        gc.collect()
""")


def generate(load_format: str, models: List[str], extra_env: Dict[str, str] = None) -> Tuple[Dict[str, list], str]:
    env = dict(os.environ, PROMPTS=json.dumps(PROMPTS), VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_LOGGING_STREAM="ext://sys.stderr",
               VLLM_CPU_OMP_THREADS_BIND="nobind", **(extra_env or {}))
    r = subprocess.run([sys.executable, "-c", GENERATE, load_format, *models], env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-20000:]
    results = {}
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            row = json.loads(line[len("RESULT "):])
            results[row["model"]] = row["outputs"]
    assert sorted(results) == sorted(models), r.stdout
    return results, r.stderr


@pytest.fixture(scope="module")
def native(passthrough_mount):
    """vLLM's own load (load format safetensors) from the source directories, no plugin."""
    m = passthrough_mount
    results, _ = generate("safetensors", [os.path.join(m.src, "base"), os.path.join(m.src, "finetune")],
                          {"VLLM_PLUGINS": ""})
    return results


@pytest.fixture(scope="module")
def through_mount(passthrough_mount):
    """Load format ckptfs from the digest paths, and from a by-name link, each preloaded and pinned first."""
    m = passthrough_mount
    models = [m.digest_path("base"), m.digest_path("finetune"), m.path("by-name", "finetune")]
    return generate("ckptfs", models, {"CKPTFS_VLLM_PRELOAD": "pin"})


def test_ckptfs_load_format_generates_what_native_vllm_generates(passthrough_mount, native, through_mount):
    m = passthrough_mount
    got, _ = through_mount
    base, finetune = m.digest_path("base"), m.digest_path("finetune")
    assert got[base] == native[os.path.join(m.src, "base")]
    assert got[finetune] == native[os.path.join(m.src, "finetune")]
    assert got[m.path("by-name", "finetune")] == got[finetune]
    assert got[base] != got[finetune]


def loaded_lines(log: str, name: str) -> List[str]:
    return [l for l in log.splitlines() if f"ckptfs: loaded {name} (by-name: " in l]


def test_the_log_names_each_digest_and_its_by_name_path(passthrough_mount, through_mount):
    m = passthrough_mount
    _, log = through_mount
    base, finetune = digest_of(os.path.join(m.src, "base")), digest_of(os.path.join(m.src, "finetune"))
    base_lines, finetune_lines = loaded_lines(log, base), loaded_lines(log, finetune)
    assert len(base_lines) == 1 and len(finetune_lines) == 2, log[-20000:]
    # Given the digest path, the by-name paths come from the daemon; given a link, it is the link.
    assert "by-name: by-name/base, by-name/base-copy, by-name/hub/" in base_lines[0]
    assert f"from {m.path(base)} with load format ckptfs" in base_lines[0]
    assert "(by-name: by-name/finetune) from " in finetune_lines[1]
    load_format_lines = [l for l in log.splitlines() if "ckptfs: load format ckptfs: " in l]
    assert len(load_format_lines) == 3
    assert all("8 shard(s)" in l and "mapped read-only through the mount" in l and
               "not registered for DMA: CUDA absent" in l for l in load_format_lines), load_format_lines


def test_preload_and_pin_before_the_load(passthrough_mount, through_mount):
    import ckptfs
    m = passthrough_mount
    _, log = through_mount
    for checkpoint in ("base", "finetune"):
        name = digest_of(os.path.join(m.src, checkpoint))
        assert f"ckptfs: preloaded {name} (" in log and ", pinned) into the host tier" in log
        row = ckptfs.stats(m.path("by-name", checkpoint))["checkpoints"][0]
        size = sum(os.path.getsize(os.path.join(m.src, checkpoint, n)) for n in os.listdir(os.path.join(m.src, checkpoint)))
        assert row["name"] == name and row["pinned"] >= size, row
