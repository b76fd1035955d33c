"""Fixtures of the engines tests: the ckptfs daemon mounted for real over a
source tree of the tiny Qwen3 checkpoints, under a temporary directory, and
always unmounted.

Environment (run_pytest.sh sets it): CKPTFS_BINARY, the daemon;
CKPTFS_TEST_MODELS, the directory make_models.py filled.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, Iterator, List

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from ckptfs_mount import digest_of, is_mounted, unmount, wait_for, write_ref, write_snapshot  # noqa: E402,F401

HUB_REPO = "org/tiny-qwen3"
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"
CHECKPOINTS = ("base", "base-copy", "finetune")


def weight_files(directory: str) -> List[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))


def write_hub_repo(src: str, checkpoint: str) -> str:
    """SRC/hub/models--org--tiny-qwen3 holding CHECKPOINT's files as the
    snapshot refs/main names; returns the snapshot directory."""
    repo = os.path.join(src, "hub", "models--" + HUB_REPO.replace("/", "--"))
    files = {}
    for name in sorted(os.listdir(checkpoint)):
        if not name.startswith("."):
            with open(os.path.join(checkpoint, name), "rb") as f:
                files[name] = f.read()
    snapshot = write_snapshot(repo, HUB_COMMIT, files)
    write_ref(repo, "main", HUB_COMMIT)
    return snapshot


@dataclass
class Mount:
    src: str
    mnt: str
    log_path: str
    options: str

    def path(self, *parts: str) -> str:
        return os.path.join(self.mnt, *parts)

    def digest_path(self, checkpoint: str) -> str:
        return self.path(digest_of(os.path.join(self.src, checkpoint)))

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


@contextlib.contextmanager
def mounted(tmp: str, src: str, options: str, expect: List[str]) -> Iterator[Mount]:
    """The daemon over SRC at TMP/mnt with OPTIONS, once every path in
    `expect` (below the mount point) is visible; unmounted on the way out."""
    mnt, state, log_path = (os.path.join(tmp, d) for d in ("mnt", "state", "daemon.log"))
    os.makedirs(mnt)
    opts = ",".join(o for o in ("state=" + state, "settle=0", "rescan=0", options) if o)
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen([os.environ["CKPTFS_BINARY"], src, mnt, "-f", "-o", opts], stdout=log, stderr=log)
    try:
        m = Mount(src, mnt, log_path, options)
        if not wait_for(lambda: is_mounted(mnt) and all(os.path.exists(m.path(p)) for p in expect), seconds=60):
            raise AssertionError(f"the mount did not show {expect}; daemon log:\n{m.log()}")
        yield m
    finally:
        unmount(mnt, daemon)


@pytest.fixture(scope="session")
def models() -> str:
    return os.environ["CKPTFS_TEST_MODELS"]


@pytest.fixture(scope="session")
def source_tree(models: str, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, str]:
    """SRC with base, base-copy (identical), finetune and a hub cache of base."""
    root = str(tmp_path_factory.mktemp("ckptfs-engines"))
    os.chmod(root, 0o755)
    src = os.path.join(root, "src")
    os.makedirs(src)
    for name in CHECKPOINTS:
        shutil.copytree(os.path.join(models, "finetune" if name == "finetune" else "base"), os.path.join(src, name),
                        ignore=shutil.ignore_patterns(".*"))
    write_hub_repo(src, os.path.join(src, "base"))
    return {"root": root, "src": src}


def _mount_fixture(options: str, name: str):
    @pytest.fixture(scope="module")
    def fixture(source_tree: Dict[str, str]) -> Iterator[Mount]:
        with tempfile.TemporaryDirectory(prefix=f"ckptfs-{name}-", dir=source_tree["root"]) as tmp:
            expect = [os.path.join("by-name", c) for c in CHECKPOINTS]
            expect.append(os.path.join("by-name", "hub", "models--org--tiny-qwen3", "refs", "main"))
            with mounted(tmp, source_tree["src"], options, expect) as m:
                yield m
    return fixture


# The default mount (whole files in the host tier, handed to the kernel with
# passthrough), and the chunk path (fill=off: every read is the daemon's).
passthrough_mount = _mount_fixture("", "passthrough")
chunk_mount = _mount_fixture("fill=off", "chunks")


@pytest.fixture(scope="module", params=["passthrough", "chunks"])
def any_mount(request: pytest.FixtureRequest) -> Mount:
    return request.getfixturevalue("passthrough_mount" if request.param == "passthrough" else "chunk_mount")
