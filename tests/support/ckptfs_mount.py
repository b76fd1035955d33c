"""Helpers of the Python tests that mount ckptfs for real
(tests/integration/hub_offline_test.py, tests/engines/): mount state,
unmounting whatever state the daemon is in, the README's digest of a flat
directory, and a Hugging Face hub cache laid out as huggingface_hub lays it
out. Standard library only."""
import hashlib
import os
import subprocess
import time


def is_mounted(path):
    # Bytes: other mounts may have names that are not UTF-8.
    with open("/proc/self/mountinfo", "rb") as f:
        return any(line.split()[4] == os.fsencode(path) for line in f)


def unmount(mnt, daemon, timeout=20):
    """Unmounts and reaps the daemon, whatever state either is in."""
    try:
        subprocess.run(["fusermount3", "-u", mnt], check=False, stderr=subprocess.DEVNULL)
        daemon.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()
    finally:
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt], check=False)


def wait_for(condition, seconds=30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def digest_of(directory):
    """The checkpoint digest of a flat directory (the README's contract: dot files are no members)."""
    lines = b""
    for name in sorted(os.listdir(os.fsencode(directory))):
        if name.startswith(b"."):
            continue
        with open(os.path.join(os.fsencode(directory), name), "rb") as f:
            lines += hashlib.sha256(f.read()).hexdigest().encode() + b"  " + name + b"\n"
    return "sha256-" + hashlib.sha256(lines).hexdigest()


def write_snapshot(repo_dir, commit, files):
    """files: {name: bytes}. blobs/<sha256>, snapshots/<commit>/<name> -> ../../blobs/<sha256>."""
    os.makedirs(os.path.join(repo_dir, "blobs"), exist_ok=True)
    snapshot = os.path.join(repo_dir, "snapshots", commit)
    os.makedirs(snapshot, exist_ok=True)
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        with open(os.path.join(repo_dir, "blobs", sha), "wb") as f:
            f.write(data)
        os.symlink(os.path.join("..", "..", "blobs", sha), os.path.join(snapshot, name))
    return snapshot


def write_ref(repo_dir, revision, commit):
    path = os.path.join(repo_dir, "refs", revision)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(commit)  # as huggingface_hub writes it: no newline
