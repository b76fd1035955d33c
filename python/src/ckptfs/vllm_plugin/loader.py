"""Load format `ckptfs`: vLLM's default loader, whose weights are views of
each safetensors shard mapped through the mount, registered read-only with
CUDA when CUDA is present (host_register.py) and unregistered after the load.

    vllm serve "$(ckptfsctl resolve /models/by-name/NAME)" --load-format ckptfs

What it does is said in one log line per load: how many shards were mapped,
and whether they were registered for DMA, or why not (CUDA absent, or the
device refused, with CUDA's error), in which case the views are copied to
the device as pageable memory, as the default iterator's tensors are. A
shard that cannot be mapped (not safetensors as this torch knows it) is
read by vLLM's default safetensors iterator, and the log says so too.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Generator, Iterable, List, Optional, Tuple

import torch

from . import logger
from .host_register import Registrar, Registrations, cuda_registrar
from .mapped_shards import MappedShard, ShardRefused

LOAD_FORMAT = "ckptfs"

Weights = Generator[Tuple[str, "torch.Tensor"], None, None]


@dataclasses.dataclass
class LoadReport:
    """What one load did with its shards, for the log."""

    mapped: List[str] = dataclasses.field(default_factory=list)
    mapped_bytes: int = 0
    default: List[Tuple[str, str]] = dataclasses.field(default_factory=list)  # (shard, why)

    def describe(self, registrations: Registrations, no_registrar_why: str, release_failures: List[str]) -> str:
        parts = [f"{len(self.mapped)} shard(s), {self.mapped_bytes / 2**20:.1f} MiB, mapped read-only through "
                 "the mount"]
        if registrations.registrar is None:
            parts.append(f"not registered for DMA: {no_registrar_why}; copied as pageable memory")
        else:
            parts.append(f"{len(registrations.registered)} registered with {registrations.registrar.name} for "
                         "DMA and unregistered after the load")
        for shard, why in registrations.refused:
            parts.append(f"registration of {shard} refused ({why}); it was copied as pageable memory")
        for shard, why in self.default:
            parts.append(f"{shard} read by the default safetensors iterator instead ({why})")
        parts.extend(f"unregistering failed: {f}" for f in release_failures)
        return "; ".join(parts)


def mapped_weights(files: Iterable[str], registrations: Registrations, report: LoadReport,
                   default_iterator: Callable[[List[str]], Iterable[Tuple[str, "torch.Tensor"]]],
                   keep: Optional[Callable[[str], bool]] = None) -> Weights:
    """The tensors of `files`, shard by shard, each shard mapped (and
    registered) when it is reached. `keep(name)` false skips a tensor before
    it is touched (vLLM's expert-parallel filter)."""
    for path in files:
        try:
            shard = MappedShard(path)
        except ShardRefused as e:
            report.default.append((path, e.cause))
            yield from default_iterator([path])
            continue
        report.mapped.append(path)
        report.mapped_bytes += shard.size
        registrations.register(shard)
        for name, tensor in shard.tensors():
            if keep is None or keep(name):
                yield name, tensor


def register_load_format() -> None:
    try:
        from vllm.model_executor.model_loader import register_model_loader
        from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
        from vllm.model_executor.model_loader import weight_utils
        from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight
    except Exception as e:
        logger.warning("ckptfs: vLLM's default model loader cannot be imported (%s): load format %s is not "
                       "registered", e, LOAD_FORMAT)
        return

    class CkptfsModelLoader(DefaultModelLoader):  # type: ignore[misc, valid-type]
        """DefaultModelLoader with safetensors shards as mapped, registered views."""

        ckptfs_load_format = LOAD_FORMAT

        def __init__(self, load_config: Any) -> None:
            # The files are those of load format "safetensors".
            super().__init__(dataclasses.replace(load_config, load_format="safetensors"))
            self._registrations: Optional[Registrations] = None
            self._report: Optional[LoadReport] = None

        def _default_iterator(self, files: List[str]) -> Iterable[Tuple[str, "torch.Tensor"]]:
            return weight_utils.safetensors_weights_iterator(files, False, local_expert_ids=self.local_expert_ids)

        def _select_files(self, source: Any) -> List[str]:
            """The shards DefaultModelLoader would read for `source` (its filters, in its order)."""
            folder, files, _, index_file = self._prepare_weights(
                source.model_or_path, source.subfolder, source.revision, False, source.allow_patterns_overrides)
            if self._encoder_only_lm_prefixes is not None and files:
                files = weight_utils.filter_mm_encoder_only_safetensors_files(
                    files, folder, index_file, self._encoder_only_lm_prefixes,
                    weights_mapper=self._encoder_only_weights_mapper)
            if source.is_unused_weight is not None:
                files = weight_utils.filter_safetensors_files_by_weight_name(files, source.is_unused_weight)
            return sorted(files, key=weight_utils._natural_sort_key)

        def _get_weights_iterator(self, source: Any) -> Weights:
            files = self._select_files(source)
            if self.counter_before_loading_weights == 0.0:
                self.counter_before_loading_weights = time.perf_counter()
            if self._registrations is None or self._report is None:  # called outside load_weights
                weights: Iterable[Tuple[str, torch.Tensor]] = self._default_iterator(files)
            else:
                local = self.local_expert_ids
                weights = mapped_weights(files, self._registrations, self._report, self._default_iterator,
                                         keep=lambda name: not should_skip_weight(name, local))
            return ((source.prefix + name, tensor) for name, tensor in weights)

        def load_weights(self, model: Any, model_config: Any) -> None:
            registrar, why = cuda_registrar()
            self._registrations, self._report = Registrations(registrar), LoadReport()
            try:
                super().load_weights(model, model_config)
            finally:
                registrations, report = self._registrations, self._report
                self._registrations = self._report = None
                failures = registrations.release()
                logger.info("ckptfs: load format %s: %s", LOAD_FORMAT, report.describe(registrations, why, failures))

    register_model_loader(LOAD_FORMAT)(CkptfsModelLoader)


__all__ = ["LOAD_FORMAT", "LoadReport", "Registrar", "mapped_weights", "register_load_format"]
