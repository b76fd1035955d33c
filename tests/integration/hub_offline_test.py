#!/usr/bin/env python3
"""The real huggingface_hub, offline, through a ckptfs mount (issue 13, item 3).

Builds a hub cache the way huggingface_hub lays it out (blobs named by
SHA-256, snapshots/<commit>/ links into ../../blobs, refs/<revision> holding
the commit), writes the weights with the real safetensors library, mounts it
with ckptfs, and then, with HF_HUB_CACHE=<mnt>/by-name/hub and
HF_HUB_OFFLINE=1, resolves the repository with snapshot_download and
hf_hub_download(local_files_only=True) and loads the tensors through the
mount. Always unmounts.

usage: hub_offline_test.py CKPTFS_BINARY
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ckptfs_mount import digest_of, is_mounted, unmount, wait_for, write_ref, write_snapshot  # noqa: E402

REPO_ID = "org/tiny-model"
COMMIT_MAIN = "0123456789abcdef0123456789abcdef01234567"
COMMIT_V1 = "fedcba9876543210fedcba9876543210fedcba98"


def safetensors_bytes(tensors):
    from safetensors.numpy import save
    return save(tensors, metadata={"format": "pt"})


def check_offline_client(mnt, snapshot_src, tensors):
    import numpy as np
    from huggingface_hub import hf_hub_download, snapshot_download
    from safetensors.numpy import load_file

    expected_digest = os.path.join(mnt, digest_of(snapshot_src))
    path = snapshot_download(REPO_ID, local_files_only=True)
    assert path == os.path.join(mnt, "by-name", "hub", "models--org--tiny-model", "snapshots", COMMIT_MAIN), path
    assert os.path.realpath(path) == expected_digest, (os.path.realpath(path), expected_digest)
    loaded = load_file(os.path.join(path, "model.safetensors"))
    assert sorted(loaded) == sorted(tensors), sorted(loaded)
    for name, value in tensors.items():
        assert np.array_equal(loaded[name], value), name

    config = hf_hub_download(REPO_ID, "config.json", local_files_only=True)
    assert os.path.realpath(config) == os.path.join(expected_digest, "config.json"), config
    with open(config) as f:
        assert f.read() == '{"model_type": "tiny"}\n'
    # A second revision name (a tag) resolves through its own ref.
    v1 = snapshot_download(REPO_ID, revision="v1", local_files_only=True)
    assert os.path.basename(v1) == COMMIT_V1, v1
    assert os.path.realpath(v1) != os.path.realpath(path)
    print("huggingface_hub offline: snapshot_download and hf_hub_download resolved", REPO_ID,
          "through refs/main to", os.path.realpath(path))


def main():
    ckptfs = sys.argv[1]
    import numpy as np

    rng = np.random.default_rng(7)
    tensors = {"embed.weight": rng.standard_normal((64, 32), dtype=np.float32),
               "lm_head.weight": rng.standard_normal((32, 64), dtype=np.float32)}
    with tempfile.TemporaryDirectory(prefix="ckptfs-hf-") as tmp:
        os.chmod(tmp, 0o755)
        src, mnt, state = (os.path.join(tmp, d) for d in ("src", "mnt", "state"))
        os.makedirs(mnt)
        repo = os.path.join(src, "hub", "models--org--tiny-model")
        snapshot = write_snapshot(repo, COMMIT_MAIN, {"model.safetensors": safetensors_bytes(tensors),
                                                      "config.json": b'{"model_type": "tiny"}\n'})
        write_snapshot(repo, COMMIT_V1, {"model.safetensors": safetensors_bytes({"w": np.zeros(4, np.float32)})})
        write_ref(repo, "main", COMMIT_MAIN)
        write_ref(repo, "v1", COMMIT_V1)

        with open(os.path.join(tmp, "daemon.log"), "wb") as log:
            daemon = subprocess.Popen([ckptfs, src, mnt, "-f", "-o", "state=%s,settle=0,rescan=0" % state],
                                      stdout=log, stderr=log)
        try:
            # Every ref appears with the first snapshot indexed; each snapshot
            # appears as its own hashing ends: wait for both.
            hub_repo = os.path.join(mnt, "by-name", "hub", "models--org--tiny-model")
            wanted = [os.path.join(hub_repo, "refs", "v1")] + \
                [os.path.join(hub_repo, "snapshots", c) for c in (COMMIT_MAIN, COMMIT_V1)]
            if not wait_for(lambda: is_mounted(mnt) and all(os.path.exists(p) for p in wanted)):
                raise SystemExit("the mount did not show %s; daemon log:\n%s" %
                                 (wanted, open(os.path.join(tmp, "daemon.log")).read()))
            os.environ["HF_HUB_CACHE"] = os.path.join(mnt, "by-name", "hub")
            os.environ["HF_HUB_OFFLINE"] = "1"
            check_offline_client(mnt, snapshot, tensors)
        finally:
            unmount(mnt, daemon)


if __name__ == "__main__":
    main()
