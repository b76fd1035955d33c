"""The loaders engines use, from PyPI, read every tensor of the fine-tune
bit-exact through the mount: on the passthrough path (the default mount)
and on the chunk path (fill=off). The reference is the source directory,
read with safetensors' numpy API."""
from __future__ import annotations

import os
from typing import Dict

import numpy as np
import pytest
import torch

from conftest import HUB_COMMIT, HUB_REPO, weight_files

CHECKPOINT = "finetune"


@pytest.fixture(scope="module")
def reference(source_tree) -> Dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    out: Dict[str, np.ndarray] = {}
    directory = os.path.join(source_tree["src"], CHECKPOINT)
    for name in weight_files(directory):
        out.update(load_file(os.path.join(directory, name)))
    return out


def assert_bit_exact(got: Dict[str, object], want: Dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for name, value in got.items():
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        assert array.dtype == want[name].dtype and array.shape == want[name].shape, name
        assert array.tobytes() == want[name].tobytes(), name


def shards(directory: str):
    return [os.path.join(directory, n) for n in weight_files(directory)]


def assert_served_as_mounted(mount) -> None:
    """The reads went the way the mount's options send them."""
    import ckptfs
    opens = ckptfs.stats(mount.mnt)["opens"]
    if mount.options == "fill=off":
        assert "passthrough" not in opens and any(k.startswith("chunk path") for k in opens), opens
    elif ckptfs.stats(mount.mnt)["passthrough"]["mode"] == "on":
        assert opens.get("passthrough", 0) > 0, opens


@pytest.mark.parametrize("framework", ["numpy", "pt"])
def test_safetensors_safe_open(any_mount, reference, framework):
    from safetensors import safe_open
    got = {}
    for path in shards(any_mount.digest_path(CHECKPOINT)):
        with safe_open(path, framework=framework) as f:
            got.update({k: f.get_tensor(k) for k in f.keys()})
    assert_bit_exact(got, reference)
    assert_served_as_mounted(any_mount)


def test_transformers_from_pretrained(any_mount, reference):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(any_mount.digest_path(CHECKPOINT), dtype=torch.float32)
    assert_bit_exact(dict(model.state_dict()), reference)


def test_huggingface_hub_offline_through_by_name_refs(any_mount, source_tree):
    from huggingface_hub import snapshot_download
    from safetensors.numpy import load_file
    # HF_HUB_OFFLINE=1 (run_pytest.sh); the cache is the mount's by-name/hub.
    snapshot = snapshot_download(HUB_REPO, cache_dir=any_mount.path("by-name", "hub"), local_files_only=True)
    assert snapshot == any_mount.path("by-name", "hub", "models--org--tiny-qwen3", "snapshots", HUB_COMMIT)
    assert os.path.realpath(snapshot) == any_mount.digest_path("base")
    want = {}
    for path in shards(os.path.join(source_tree["src"], "base")):
        want.update(load_file(path))
    got = {}
    for path in shards(snapshot):
        got.update(load_file(path))
    assert_bit_exact(got, want)


def test_fastsafetensors_nogds(any_mount, reference):
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup
    loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
    try:
        files = shards(any_mount.digest_path(CHECKPOINT))
        loader.add_filenames({0: files})
        buffers = loader.copy_files_to_device()
        try:
            got = {k: buffers.get_tensor(k).clone() for k in loader.get_keys()}
        finally:
            buffers.close()
    finally:
        loader.close()
    assert_bit_exact(got, reference)


def test_runai_model_streamer(any_mount, reference):
    from runai_model_streamer import SafetensorsStreamer
    got = {}
    with SafetensorsStreamer() as streamer:
        streamer.stream_files(shards(any_mount.digest_path(CHECKPOINT)))
        for name, tensor in streamer.get_tensors():
            got[name] = tensor.clone()
    assert_bit_exact(got, reference)
