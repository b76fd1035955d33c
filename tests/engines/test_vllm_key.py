"""The keys engines cache weights under, through a real mount, without and
with the plugin, each in a fresh process as vLLM would run it: vLLM's own
weight-cache key (weight_cache.protocol.hash_checkpoint, and
WeightCacheKey's checkpoint field), and ModelExpress's source identity
(model path and revision, hashed into its mx_source_id).

ModelExpress is installed without its dependencies in a directory of its
own (make_venv.sh: venv-engines/modelexpress) and put on the path here only,
with VLLM_PLUGINS naming the plugins to load, so that its own vLLM plugin
stays out of every engine these tests start."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Dict, List, Tuple

import pytest

from conftest import digest_of

MODELEXPRESS = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "modelexpress")

# Logging is set up as an engine sets it up, then the vllm.general_plugins
# entry points VLLM_PLUGINS names are loaded as vLLM loads them ("" loads
# none). Without plugins the process then also tries the plugin on a vLLM
# version it was not checked against.
KEYS = textwrap.dedent("""
    import json, sys
    from types import SimpleNamespace
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging
    configure_logging(LoggingConfig())
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.model_executor.model_loader.weight_cache import protocol
    from modelexpress.engines.vllm.source_identity import build_source_identity
    from modelexpress.metadata.source_id import compute_mx_source_id
    out = {"key": {}, "mx": {}}
    for path in sys.argv[2:]:
        out["key"][path] = protocol.hash_checkpoint(path)
        model_config = SimpleNamespace(model=path, revision=None, dtype="torch.float32", quantization=None)
        parallel = SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1)
        identity = build_source_identity(SimpleNamespace(parallel_config=parallel), model_config)
        out["mx"][path] = {"revision": identity.revision, "id": compute_mx_source_id(identity)}
    if sys.argv[1] == "plugins":
        from vllm.config import ModelConfig
        config = ModelConfig(model=sys.argv[2])
        out["WeightCacheKey.checkpoint"] = protocol.WeightCacheKey.from_model_config(config, 1, 0).checkpoint
    else:
        import vllm.version
        vllm.version.__version__ = "0.31.0"
        import ckptfs.vllm_plugin as plugin
        plugin.register()
        from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER
        out["patched on 0.31.0"] = [hasattr(protocol.hash_checkpoint, "_ckptfs_original"),
                                    "ckptfs" in _LOAD_FORMAT_TO_MODEL_LOADER]
    print("KEYS " + json.dumps(out))
""")


def run_keys(paths: List[str], plugins: bool) -> Tuple[Dict[str, Any], str]:
    if not os.path.isfile(os.path.join(MODELEXPRESS, "modelexpress", "__init__.py")):
        pytest.fail(f"ModelExpress is not installed in {MODELEXPRESS} (make_venv.sh installs it)")
    env = dict(os.environ, PYTHONPATH=MODELEXPRESS, VLLM_PLUGINS="ckptfs" if plugins else "",
               VLLM_LOGGING_STREAM="ext://sys.stderr",  # stdout carries the keys
               MX_MODEL_REVISION="main")  # a deployer's revision name, the same on every node
    r = subprocess.run([sys.executable, "-c", KEYS, "plugins" if plugins else "none", *paths], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-20000:]
    line = [l for l in r.stdout.splitlines() if l.startswith("KEYS ")][-1]
    return json.loads(line[len("KEYS "):]), r.stderr


def key_paths(m) -> List[str]:
    # The first is the one whose WeightCacheKey is made.
    return [m.path("by-name", "base"), m.path("by-name", "finetune"), m.path("by-name", "base-copy"),
            m.digest_path("base"), m.digest_path("finetune"), os.path.join(m.src, "base")]


@pytest.fixture(scope="module")
def without_plugin(passthrough_mount):
    return run_keys(key_paths(passthrough_mount), plugins=False)


@pytest.fixture(scope="module")
def with_plugin(passthrough_mount):
    return run_keys(key_paths(passthrough_mount), plugins=True)


def test_without_the_plugin_a_fine_tune_gets_its_base_key(passthrough_mount, without_plugin):
    out, _ = without_plugin
    values = [out["key"][p] for p in key_paths(passthrough_mount)]
    # The bug the plugin fixes: names and headers are all vLLM hashes.
    assert len(set(values)) == 1 and values[0] is not None, out["key"]


def test_with_the_plugin_the_key_is_the_digest(passthrough_mount, with_plugin, without_plugin):
    m = passthrough_mount
    base, finetune = digest_of(os.path.join(m.src, "base")), digest_of(os.path.join(m.src, "finetune"))
    out, log = with_plugin
    keys = out["key"]
    assert keys[m.path("by-name", "base")] == base
    assert keys[m.path("by-name", "finetune")] == finetune
    assert keys[m.digest_path("finetune")] == finetune != base
    # Identical copies share one digest, so one key.
    assert keys[m.path("by-name", "base-copy")] == keys[m.digest_path("base")] == base
    assert out["WeightCacheKey.checkpoint"] == base
    # Inert off the mount: vLLM's own key for the same bytes in SRC.
    native = os.path.join(m.src, "base")
    assert keys[native] == without_plugin[0]["key"][native] != base
    assert f"ckptfs: weight-cache key of {m.path('by-name', 'finetune')} is its digest {finetune}" in log


def test_modelexpress_revision_is_the_digest(passthrough_mount, with_plugin, without_plugin):
    m = passthrough_mount
    base, finetune = digest_of(os.path.join(m.src, "base")), digest_of(os.path.join(m.src, "finetune"))
    theirs, (ours, log) = without_plugin[0]["mx"], with_plugin
    ours = ours["mx"]
    # Without the plugin a by-name path's identity is its name and "main", whatever bytes it leads to.
    assert {v["revision"] for v in theirs.values()} == {"main"}
    assert ours[m.path("by-name", "base")]["revision"] == ours[m.path("by-name", "base-copy")]["revision"] == base
    assert ours[m.path("by-name", "finetune")]["revision"] == ours[m.digest_path("finetune")]["revision"] == finetune
    assert ours[m.path("by-name", "finetune")]["id"] != theirs[m.path("by-name", "finetune")]["id"]
    native = os.path.join(m.src, "base")
    assert ours[native] == theirs[native]  # off the mount: ModelExpress's own identity
    assert (f"ckptfs: ModelExpress revision of {m.path('by-name', 'finetune')} is its digest {finetune} "
            "(not 'main'") in log


def test_another_vllm_version_is_left_alone_and_the_log_says_so(without_plugin):
    out, log = without_plugin
    assert out["patched on 0.31.0"] == [False, False]
    assert "ckptfs: vLLM 0.31.0 is not a version this plugin was checked against (0.32): it does not apply" in log
