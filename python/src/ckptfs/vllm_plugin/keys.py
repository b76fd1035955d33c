"""Cache keys made from the digest.

vLLM's weight cache (`--load-format ipc_cache`, `vllm preload`) keys a
checkpoint by hash_checkpoint(): the MD5 of its shard basenames and raw
safetensors headers. A fine-tune that keeps its base's names and shapes has
the same headers, so it gets the base's key, and the base's cached weights.
On a ckptfs mount the directory's digest names every byte; it becomes the
key. Identical copies have one digest, so they still share a key.

ModelExpress's source identity hashes the model path and a revision (its
MX_MODEL_REVISION, else vLLM's --revision), which for a local directory is
usually empty: two nodes given the same by-name path for different bytes
would share weights. On a ckptfs mount the digest becomes the revision.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import threading
from types import ModuleType
from typing import Any, Callable, List, Optional, Set, Tuple

from . import logger
from .checkpoint import mounted_checkpoint

_logged: Set[str] = set()
_logged_lock = threading.Lock()


def _log_once(key: str, message: str, *args: Any) -> None:
    with _logged_lock:
        if key in _logged:
            return
        _logged.add(key)
    logger.info(message, *args)


def digest_key(model: str) -> Optional[str]:
    """The digest ("sha256-<hex>") when `model` is a checkpoint on a ckptfs mount, else None."""
    checkpoint = mounted_checkpoint(model)
    return None if checkpoint is None else checkpoint.digest


def _patched(original: Callable[..., Any], replacement: Callable[..., Any]) -> Callable[..., Any]:
    functools.update_wrapper(replacement, original)
    replacement._ckptfs_original = original  # type: ignore[attr-defined]
    return replacement


def _signature_is(fn: Callable[..., Any], names: list) -> bool:
    try:
        return list(inspect.signature(fn).parameters) == names
    except (TypeError, ValueError):
        return False


def _target(module_name: str, name: str, params: List[str], left: str) -> Optional[Tuple[ModuleType, Any]]:
    """The module and function a patch replaces; None (and a warning saying
    the thing is `left` as it is) when this version has no such function,
    None alone when it is patched already."""
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        logger.warning("ckptfs: %s cannot be imported (%s): %s", module_name, e, left)
        return None
    original = getattr(module, name, None)
    if original is None or not _signature_is(original, params):
        logger.warning("ckptfs: this version's %s has no %s(%s): %s", module_name, name, ", ".join(params), left)
        return None
    if hasattr(original, "_ckptfs_original"):
        return None
    return module, original


def patch_weight_cache_key() -> None:
    """hash_checkpoint(model) returns the digest for a checkpoint on ckptfs.

    WeightCacheKey.from_model_config() looks the function up in its module
    at each call, so patching the module's name sets its `checkpoint` field.
    """
    target = _target("vllm.model_executor.model_loader.weight_cache.protocol", "hash_checkpoint", ["model"],
                     "the weight-cache key is left as vLLM computes it (shard names and headers)")
    if target is None:
        return
    protocol, original = target

    def hash_checkpoint(model: str) -> Optional[str]:
        key = digest_key(model)
        if key is None:
            return original(model)  # type: ignore[no-any-return]
        _log_once("key:" + model, "ckptfs: weight-cache key of %s is its digest %s", model, key)
        return key

    setattr(protocol, "hash_checkpoint", _patched(original, hash_checkpoint))


def patch_modelexpress_identity() -> None:
    """The revision of ModelExpress's source identity is the digest on ckptfs."""
    if importlib.util.find_spec("modelexpress") is None:
        return
    target = _target("modelexpress.engines.vllm.source_identity", "_resolve_model_revision", ["model_config"],
                     "ModelExpress's source identity is left as it is (model path and MX_MODEL_REVISION)")
    if target is None:
        return
    identity, original = target

    def _resolve_model_revision(model_config: Any) -> str:
        theirs: str = original(model_config)
        model = getattr(model_config, "model", None)
        key = digest_key(model) if isinstance(model, str) else None
        if key is None or not isinstance(model, str):
            return theirs
        if theirs and theirs != key:
            _log_once("mx:" + model, "ckptfs: ModelExpress revision of %s is its digest %s (not %r: a revision "
                                     "name can be moved to other bytes, the digest cannot)", model, key, theirs)
        else:
            _log_once("mx:" + model, "ckptfs: ModelExpress revision of %s is its digest %s", model, key)
        return key

    setattr(identity, "_resolve_model_revision", _patched(original, _resolve_model_revision))


def original_of(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function a patch replaced (itself when it is not a patch)."""
    return getattr(fn, "_ckptfs_original", fn)


__all__ = ["digest_key", "original_of", "patch_modelexpress_identity", "patch_weight_cache_key"]
