"""Safetensors shards mapped read-only, their tensors views of the mapping.

The header is checked as the safetensors library checks it (length, JSON,
dtype, shape, offsets inside the data and matching the shape) before any
view is made, so a malformed shard is refused with its path and the reason,
never read out of bounds. Tensors are read-only views: nothing is copied
until the model's weight loader copies them into its parameters (to the
GPU: from registered pages, one DMA).
"""
from __future__ import annotations

import json
import math
import mmap
import os
import struct
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Tuple

import torch

from ..errors import CkptfsError

# The safetensors library's bound on a header.
MAX_HEADER = 100_000_000


def _dtypes() -> Dict[str, "torch.dtype"]:
    names = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
             "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "U16": "uint16",
             "U32": "uint32", "U64": "uint64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
             "F8_E8M0": "float8_e8m0fnu"}
    return {k: getattr(torch, v) for k, v in names.items() if hasattr(torch, v)}


DTYPES = _dtypes()


class ShardRefused(CkptfsError):
    """The shard cannot be served as views of a mapping (the default iterator reads it instead)."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: "torch.dtype"
    shape: Tuple[int, ...]
    begin: int  # offsets in the file
    end: int


def parse_header(path: str, head: bytes, file_size: int) -> Tuple[int, List[TensorEntry]]:
    """(offset of the data, entries by offset) of a shard whose first bytes are `head`."""
    if file_size < 8 or len(head) < 8:
        raise ShardRefused(path, f"{file_size} bytes is too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", head[:8])
    if header_len > MAX_HEADER or 8 + header_len > file_size:
        raise ShardRefused(path, f"header length {header_len} does not fit the file of {file_size} bytes")
    if len(head) < 8 + header_len:
        raise ShardRefused(path, f"header of {header_len} bytes cut short at {len(head) - 8}")
    try:
        header = json.loads(head[8:8 + header_len])
    except ValueError as e:
        raise ShardRefused(path, f"header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ShardRefused(path, "header is not a JSON object")
    data_start = 8 + header_len
    data_len = file_size - data_start
    entries = [_entry(path, name, spec, data_start, data_len) for name, spec in header.items()
               if name != "__metadata__"]
    return data_start, sorted(entries, key=lambda e: (e.begin, e.name))


def _entry(path: str, name: str, spec: Any, data_start: int, data_len: int) -> TensorEntry:
    if not isinstance(spec, dict):
        raise ShardRefused(path, f"tensor {name!r}: not an object")
    dtype_name = spec.get("dtype")
    dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise ShardRefused(path, f"tensor {name!r}: dtype {spec.get('dtype')!r} is not one this torch maps")
    shape = spec.get("shape")
    offsets = spec.get("data_offsets")
    if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
            or not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)):
        raise ShardRefused(path, f"tensor {name!r}: malformed shape or data_offsets")
    begin, end = offsets
    itemsize = torch.empty((), dtype=dtype).element_size()
    if not 0 <= begin <= end <= data_len or end - begin != math.prod(shape) * itemsize:
        raise ShardRefused(path, f"tensor {name!r}: data_offsets {offsets} do not hold shape {shape} of "
                                 f"{spec['dtype']} inside the {data_len} bytes of data")
    return TensorEntry(name, dtype, tuple(shape), data_start + begin, data_start + end)


class MappedShard:
    """One shard mapped read-only (MAP_SHARED, PROT_READ) for its tensors' lifetime."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                head = f.read(8)
                if len(head) == 8:
                    (header_len,) = struct.unpack("<Q", head)
                    if header_len <= MAX_HEADER and 8 + header_len <= size:
                        head += f.read(header_len)
                self.data_start, self.entries = parse_header(path, head, size)
                self.size = size
                self._map = mmap.mmap(f.fileno(), size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        except OSError as e:
            raise ShardRefused(path, f"cannot map: {e.strerror or e}", e.errno) from None
        with warnings.catch_warnings():
            # A view of read-only pages: the loader copies from it, never into it.
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            self._bytes = torch.frombuffer(self._map, dtype=torch.uint8)

    @property
    def address(self) -> int:
        return int(self._bytes.data_ptr())

    def tensors(self) -> Iterator[Tuple[str, "torch.Tensor"]]:
        for e in self.entries:
            raw = self._bytes[e.begin:e.end]
            itemsize = torch.empty((), dtype=e.dtype).element_size()
            if e.begin % itemsize != 0:
                raw = raw.clone()  # a view of another dtype needs an aligned offset
            yield e.name, raw.view(e.dtype).reshape(e.shape)
