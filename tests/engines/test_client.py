"""The ckptfs package's client (resolve, digest, preload, stats, by_name)
against a real mount, and its errors."""
from __future__ import annotations

import os
import subprocess

import pytest

import ckptfs
from conftest import HUB_COMMIT, digest_of


def test_resolve_and_digest_follow_by_name_links(passthrough_mount):
    m = passthrough_mount
    base = digest_of(os.path.join(m.src, "base"))
    finetune = digest_of(os.path.join(m.src, "finetune"))
    assert base != finetune
    assert ckptfs.resolve(m.path("by-name", "base")) == m.path(base)
    assert ckptfs.resolve(m.path("by-name", "base-copy")) == m.path(base)
    assert ckptfs.resolve(m.path("by-name", "finetune")) == m.path(finetune)
    assert ckptfs.digest(m.path("by-name", "finetune")) == finetune
    # Inside a digest directory: the path itself, and the directory's digest.
    assert ckptfs.resolve(m.path(base, "config.json")) == m.path(base, "config.json")
    assert ckptfs.digest(m.path(base, "config.json")) == base
    snapshot = m.path("by-name", "hub", "models--org--tiny-qwen3", "snapshots", HUB_COMMIT)
    assert ckptfs.resolve(snapshot) == m.path(base)


def test_errors_name_the_path_and_the_cause(passthrough_mount, tmp_path):
    m = passthrough_mount
    with pytest.raises(ckptfs.NotOnCkptfsError) as e:
        ckptfs.digest(str(tmp_path))
    assert str(e.value).startswith(f"{tmp_path}: on a ") and "not on a ckptfs mount" in str(e.value)
    missing = m.path("by-name", "no-such-model")
    with pytest.raises(ckptfs.CkptfsError) as e:
        ckptfs.resolve(missing)
    assert str(e.value) == f"{missing}: No such file or directory"
    with pytest.raises(ckptfs.NotACheckpointError) as e:
        ckptfs.resolve(m.path("by-name"))
    assert str(e.value).startswith(m.path("by-name") + ": is neither a checkpoint nor inside a digest directory")
    # The daemon's refusal, with the path asked about.
    with pytest.raises(ckptfs.RefusedError) as e:
        ckptfs.preload(m.path("by-name", "hub"))
    assert str(e.value).startswith(m.path("by-name", "hub") + ": not a checkpoint nor inside a digest directory")


def test_attributes_on_another_filesystem_name_nothing(tmp_path):
    # Anyone may set user.* attributes on their own files: a tmpfs mount
    # whose root and directory carry ckptfs's attributes is still no ckptfs.
    fake = tmp_path / "fake"
    fake.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(fake)], check=True)
    try:
        model = fake / "model"
        model.mkdir()
        try:
            os.setxattr(fake, "user.ckptfs.control", b"/nonexistent.sock")
            os.setxattr(model, "user.ckptfs.digest", b"sha256-" + b"0" * 64)
        except OSError as e:
            pytest.skip(f"tmpfs takes no user.* attributes here: {e}")
        assert not ckptfs.is_on_ckptfs(str(model))
        with pytest.raises(ckptfs.NotOnCkptfsError) as e:
            ckptfs.digest(str(model))
        assert str(e.value) == f"{model}: on a tmpfs filesystem mounted at {fake}, not on a ckptfs mount"
    finally:
        subprocess.run(["umount", str(fake)], check=True)


def test_preload_pin_and_stats(passthrough_mount):
    m = passthrough_mount
    finetune = digest_of(os.path.join(m.src, "finetune"))
    size = sum(os.path.getsize(os.path.join(m.src, "finetune", n)) for n in os.listdir(os.path.join(m.src, "finetune")))
    progress = []
    reply = ckptfs.preload(m.path("by-name", "finetune"), pin=True, on_progress=lambda d, t: progress.append((d, t)))
    assert reply["ok"] is True and reply["pinned"] is True and reply["tier"] == "host"
    assert reply["bytes"] == size and reply["files"] == len(os.listdir(os.path.join(m.src, "finetune")))
    assert progress and progress[-1] == (size, size)
    rows = ckptfs.stats(m.path("by-name", "finetune"))["checkpoints"]
    assert [r["name"] for r in rows] == [finetune]
    assert rows[0]["pinned"] >= size and rows[0]["by_name"] == ["by-name/finetune"]
    everything = ckptfs.stats(m.mnt)
    assert {r["name"] for r in everything["checkpoints"]} >= {finetune, digest_of(os.path.join(m.src, "base"))}
    assert everything["passthrough"]["mode"] in ("on", "off")


def test_by_name_lists_every_link_to_a_digest(passthrough_mount):
    m = passthrough_mount
    names = ckptfs.by_name(m.path(digest_of(os.path.join(m.src, "base"))))
    assert sorted(names) == sorted(["by-name/base", "by-name/base-copy",
                                    f"by-name/hub/models--org--tiny-qwen3/snapshots/{HUB_COMMIT}"])


def test_names_that_are_not_utf8_round_trip(tmp_path):
    # File names are bytes: the protocol carries them base64 in "K_b64".
    import numpy as np
    from safetensors.numpy import save_file
    from conftest import mounted
    src = tmp_path / "src"
    checkpoint = os.path.join(os.fsencode(str(src)), b"caf\xe9")
    os.makedirs(checkpoint)
    save_file({"w": np.arange(4, dtype=np.float32)}, os.fsdecode(os.path.join(checkpoint, b"model.safetensors")))
    link = os.path.join("by-name", os.fsdecode(b"caf\xe9"))
    with mounted(str(tmp_path), str(src), "", [link]) as m:
        name = digest_of(os.fsdecode(checkpoint))
        assert ckptfs.resolve(m.path(link)) == m.path(name)
        assert ckptfs.by_name(m.path(name)) == [link]
        assert os.fsencode(ckptfs.by_name(m.path(name))[0]) == b"by-name/caf\xe9"
        rows = ckptfs.stats(m.path(link))["checkpoints"]
        assert [r["name"] for r in rows] == [name] and rows[0]["by_name"] == [link]
