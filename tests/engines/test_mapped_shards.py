"""The `ckptfs` load format's weights iterator, without vLLM's engine: shards
mapped through a real mount, tensors bit-exact, registration with a device
asked for, refused and undone. No GPU here, so the registrar is a recording
stand-in for CUDA; the real one is chosen only when CUDA is present
(host_register.cuda_registrar), which is checked too."""
from __future__ import annotations

import json
import os
import struct
from typing import List, Optional, Tuple

import pytest
import torch
from safetensors import safe_open

from ckptfs.vllm_plugin.host_register import Registrations, cuda_registrar
from ckptfs.vllm_plugin.loader import LoadReport, mapped_weights
from ckptfs.vllm_plugin.mapped_shards import MappedShard, ShardRefused
from conftest import weight_files


class RecordingRegistrar:
    """Stands in for CUDA: records what was registered; refuses when told to."""

    name = "recording registrar"

    def __init__(self, refuse: Optional[str] = None) -> None:
        self.refuse = refuse
        self.registered: List[Tuple[int, int]] = []
        self.unregistered: List[int] = []
        self.synchronized = 0

    def register(self, address: int, size: int) -> Optional[str]:
        if self.refuse:
            return self.refuse
        self.registered.append((address, size))
        return None

    def unregister(self, address: int) -> Optional[str]:
        self.unregistered.append(address)
        return None

    def synchronize(self) -> None:
        self.synchronized += 1


def reference(directory: str):
    out = {}
    for name in weight_files(directory):
        with safe_open(os.path.join(directory, name), framework="pt") as f:
            for key in f.keys():
                out[key] = f.get_tensor(key)
    return out


def no_default(files):
    raise AssertionError(f"the default iterator was asked for {files}")


def assert_bit_exact(got, want):
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name].view(torch.uint8), tensor.view(torch.uint8)), name


def test_every_tensor_is_a_bit_exact_view_of_the_mapping(any_mount):
    directory = any_mount.digest_path("finetune")
    files = [os.path.join(directory, n) for n in weight_files(directory)]
    registrar = RecordingRegistrar()
    registrations, report = Registrations(registrar), LoadReport()
    got = dict(mapped_weights(files, registrations, report, no_default))
    assert_bit_exact(got, reference(os.path.join(any_mount.src, "finetune")))
    assert report.mapped == files and not report.default
    assert report.mapped_bytes == sum(os.path.getsize(f) for f in files)
    # One registration per shard, the whole mapping, undone after the load.
    assert [size for _, size in registrar.registered] == [os.path.getsize(f) for f in files]
    assert registrations.release() == []
    assert registrar.synchronized == 1
    assert registrar.unregistered == [address for address, _ in registrar.registered]
    assert "registered with recording registrar for DMA and unregistered after the load" in \
        report.describe(registrations, "", [])


def test_a_refused_registration_still_loads_and_says_why(any_mount):
    directory = any_mount.digest_path("base")
    files = [os.path.join(directory, n) for n in weight_files(directory)]
    registrar = RecordingRegistrar(refuse="CUDA error 801 (operation not supported)")
    registrations, report = Registrations(registrar), LoadReport()
    got = dict(mapped_weights(files, registrations, report, no_default))
    assert_bit_exact(got, reference(os.path.join(any_mount.src, "base")))
    assert registrations.release() == [] and registrar.unregistered == []
    line = report.describe(registrations, "", [])
    assert f"registration of {files[0]} refused (CUDA error 801 (operation not supported))" in line
    assert "copied as pageable memory" in line


def test_without_cuda_no_registrar_and_the_reason():
    registrar, why = cuda_registrar()
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert registrar is None and "CUDA absent" in why
    line = LoadReport().describe(Registrations(None), why, [])
    assert "not registered for DMA: CUDA absent" in line


def write_shard(path: str, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # as the safetensors library pads: the data starts 8-aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize("header, data, why", [
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, "do not hold shape"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 16, "do not hold shape"),
    ({"w": {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}}, b"\0", "dtype 'X9'"),
    ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "malformed shape"),
    ({"w": [1, 2]}, b"", "not an object"),
])
def test_a_malformed_shard_is_refused_with_its_path(tmp_path, header, data, why):
    path = str(tmp_path / "bad.safetensors")
    write_shard(path, header, data)
    with pytest.raises(ShardRefused) as e:
        MappedShard(path)
    assert str(e.value).startswith(path + ": ") and why in str(e.value)


def test_a_header_longer_than_the_file_is_refused(tmp_path):
    path = str(tmp_path / "short.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ShardRefused, match="does not fit the file"):
        MappedShard(path)


def test_a_shard_it_cannot_map_goes_to_the_default_iterator(tmp_path):
    path = str(tmp_path / "odd.safetensors")
    write_shard(path, {"w": {"dtype": "X9", "shape": [1], "data_offsets": [0, 1]}}, b"\0")
    asked = []
    report = LoadReport()
    out = list(mapped_weights([path], Registrations(None), report,
                              lambda files: asked.append(files) or iter([("w", torch.zeros(1))])))
    assert asked == [[path]] and [n for n, _ in out] == ["w"]
    assert report.default and report.default[0][0] == path
    assert f"{path} read by the default safetensors iterator instead" in report.describe(Registrations(None), "x", [])


def test_unaligned_tensors_are_copied_not_misread(tmp_path):
    # Offsets need not be multiples of the element size; the view would be wrong then.
    values = torch.arange(3, dtype=torch.float32)
    path = str(tmp_path / "unaligned.safetensors")
    write_shard(path, {"b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                       "w": {"dtype": "F32", "shape": [3], "data_offsets": [1, 13]}},
                b"\x07" + values.numpy().tobytes())
    got = dict(MappedShard(path).tensors())
    assert got["b"].tolist() == [7] and torch.equal(got["w"], values)
