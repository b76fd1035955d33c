"""Around every model load from a ckptfs mount: an optional preload first,
and one log line after naming the digest loaded and its by-name path.

CKPTFS_VLLM_PRELOAD=1 (or `preload`) copies the checkpoint into the
mount's host tier before vLLM reads it; `pin` also pins it there, so an
engine's restart reads no source byte. Both are changes, for root and the
mount's owner: anyone else gets one warning and the load goes on.

The hook is each model loader class's own load_model (vLLM's
BaseModelLoader's, and those of the loaders that replace it), wrapped once;
a load that calls another loader (ipc_cache falling back to disk) is logged
once, by the outermost.
"""
from __future__ import annotations

import functools
import importlib
import os
import threading
import time
from typing import Any, Callable, Optional

from .. import preload
from ..errors import CkptfsError
from . import logger
from .checkpoint import MountedCheckpoint, mounted_checkpoint

PRELOAD_ENV = "CKPTFS_VLLM_PRELOAD"
_depth = threading.local()


def preload_mode(value: Optional[str]) -> Optional[str]:
    """None, "preload" or "pin" for the variable's value (a bad value warns)."""
    v = (value or "").strip().lower()
    if v in ("", "0", "off", "no", "false"):
        return None
    if v in ("1", "on", "yes", "true", "preload"):
        return "preload"
    if v == "pin":
        return "pin"
    logger.warning("ckptfs: %s=%r is none of 1, preload, pin or 0: no preload", PRELOAD_ENV, value)
    return None


def _preload(checkpoint: MountedCheckpoint, mode: str) -> None:
    started = time.monotonic()
    try:
        reply = preload(checkpoint.digest_path, pin=(mode == "pin"))
    except CkptfsError as e:
        logger.warning("ckptfs: %s of %s before the load failed, loading without it: %s",
                       "preload --pin" if mode == "pin" else "preload", checkpoint.digest, e)
        return
    logger.info("ckptfs: preloaded %s (%d files, %.1f MiB%s) into the host tier in %.2f s", checkpoint.digest,
                reply.get("files", 0), reply.get("bytes", 0) / 2**20, ", pinned" if reply.get("pinned") else "",
                time.monotonic() - started)


def _log_loaded(checkpoint: MountedCheckpoint, load_format: str, seconds: float) -> None:
    names = checkpoint.by_name()
    logger.info("ckptfs: loaded %s (by-name: %s) from %s with load format %s in %.2f s", checkpoint.digest,
                ", ".join(names) if names else "none visible", checkpoint.digest_path, load_format, seconds)
    if checkpoint.given_by_name is None:
        return
    after = mounted_checkpoint(checkpoint.model)
    if after is None or after.digest != checkpoint.digest:
        logger.error("ckptfs: %s moved from %s to %s during the load: the weights may mix both; give vLLM the "
                     "digest path (ckptfs.resolve, ckptfsctl resolve), which never moves", checkpoint.model,
                     checkpoint.digest, after.digest if after else "nothing")


def _model_config(args: tuple, kwargs: dict) -> Any:
    # load_model(self, vllm_config, model_config, prefix="") in every loader.
    if "model_config" in kwargs:
        return kwargs["model_config"]
    return args[2] if len(args) > 2 else None


def _checkpoint_of(model_config: Any) -> Optional[MountedCheckpoint]:
    model = getattr(model_config, "model", None)
    try:
        return mounted_checkpoint(model)
    except CkptfsError as e:  # a log line is not worth failing a load for
        logger.warning("ckptfs: cannot tell which checkpoint %s is, loading it unlogged: %s", model, e)
        return None


def _wrap(load_model: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(load_model)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        outermost = getattr(_depth, "n", 0) == 0
        _depth.n = getattr(_depth, "n", 0) + 1
        try:
            checkpoint = _checkpoint_of(_model_config(args, kwargs)) if outermost else None
            if checkpoint is None:
                return load_model(*args, **kwargs)
            mode = preload_mode(os.environ.get(PRELOAD_ENV))
            if mode is not None:
                _preload(checkpoint, mode)
            started = time.monotonic()
            model = load_model(*args, **kwargs)
            load_format = getattr(getattr(args[0], "load_config", None), "load_format", "?")
            _log_loaded(checkpoint, str(getattr(args[0], "ckptfs_load_format", load_format)),
                        time.monotonic() - started)
            return model
        finally:
            _depth.n -= 1

    wrapper._ckptfs_original = load_model  # type: ignore[attr-defined]
    return wrapper


def patch_model_loaders() -> None:
    """Wraps load_model of BaseModelLoader and of each registered loader class that defines its own."""
    try:
        loaders = importlib.import_module("vllm.model_executor.model_loader")
        base = importlib.import_module("vllm.model_executor.model_loader.base_loader").BaseModelLoader
        classes = set(getattr(loaders, "_LOAD_FORMAT_TO_MODEL_LOADER", {}).values()) | {base}
    except Exception as e:
        logger.warning("ckptfs: vLLM's model loaders cannot be imported (%s): loads are not logged by ckptfs", e)
        return
    for cls in classes:
        own = cls.__dict__.get("load_model")
        if own is not None and not hasattr(own, "_ckptfs_original"):
            cls.load_model = _wrap(own)
