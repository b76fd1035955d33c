"""The vLLM plugin of ckptfs (entry point `vllm.general_plugins`: ckptfs).

vLLM calls register() in every process it starts. For the vLLM versions it
was checked against (SUPPORTED_VLLM), it

- makes vLLM's weight-cache key (weight_cache.protocol.hash_checkpoint, and
  so the `checkpoint` field of WeightCacheKey) the ckptfs digest of the model
  directory when that directory is on a ckptfs mount, and ModelExpress's
  source-identity revision likewise when ModelExpress is installed (keys.py);
- logs, for every model loaded from a ckptfs mount, the digest it loaded and
  the by-name path it came from, and preloads it first when
  CKPTFS_VLLM_PRELOAD asks (load_log.py);
- registers the load format `ckptfs` (loader.py).

Everything it changes checks the model path first and does exactly what
vLLM does for a path that is not on a ckptfs mount. On another vLLM version
it changes nothing and says so in the log.
"""
from __future__ import annotations

import logging
import re
from typing import Optional, Tuple

# A child of vLLM's logger, so its lines go where vLLM's go, in its format.
logger = logging.getLogger("vllm.ckptfs")

# (major, minor) releases whose internals the patches were written against
# and tested with (tests/engines/).
SUPPORTED_VLLM = ((0, 32),)

_registered = False


def _version_tuple(version: str) -> Optional[Tuple[int, int]]:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def vllm_version_supported(version: str) -> bool:
    return _version_tuple(version) in SUPPORTED_VLLM


def register() -> None:
    """The entry point. Safe to call more than once."""
    global _registered
    if _registered:
        return
    _registered = True
    try:
        import vllm.version
        version = vllm.version.__version__
    except Exception as e:  # vLLM calls us, so this is a broken install
        logger.warning("ckptfs: cannot read the vLLM version (%s); the ckptfs plugin does not apply", e)
        return
    if not vllm_version_supported(version):
        supported = ", ".join("%d.%d" % v for v in SUPPORTED_VLLM)
        logger.warning("ckptfs: vLLM %s is not a version this plugin was checked against (%s): it does not apply; "
                       "the weight-cache key stays vLLM's own (shard names and headers, which a fine-tune shares "
                       "with its base) and load format ckptfs is not registered", version, supported)
        return
    from . import keys, load_log, loader
    keys.patch_weight_cache_key()
    keys.patch_modelexpress_identity()
    load_log.patch_model_loaders()
    loader.register_load_format()
    logger.debug("ckptfs: plugin applied to vLLM %s", version)
