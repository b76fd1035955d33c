#!/usr/bin/env python3
"""Soak run (by hand; tests/bench/soak.sh starts it): readers, churn,
rescans, signal storms, control floods and bad inputs, all at once, against
one real mount, for DURATION seconds.

Every read is checked without trusting the daemon: a reader reads a whole
digest directory and recomputes the checkpoint digest from the bytes it got
(DESIGN.md section 1); the directory's own name must come out. A wrong byte
anywhere would change the digest. EIO is allowed only as section 2 allows it
(a digest withdrawn while it was read); it is counted, not hidden.

Usage: soak.py DAEMON CTL WORKDIR DURATION_SECONDS
Prints one JSON object of figures at the end; exits 1 if any wrong byte was
served or the daemon died.
"""
import errno
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

DAEMON, CTL, WORK, DURATION = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
SRC, MNT, STATE = f"{WORK}/src", f"{WORK}/mnt", f"{WORK}/state"
STOP = threading.Event()
LOCK = threading.Lock()
FIG = {
    "digest_dirs_verified": 0, "bytes_verified": 0, "wrong_digests": 0, "eio_reads": 0,
    "other_read_errors": 0, "churn_versions": 0, "sighups": 0, "rescans": 0,
    "control_connections": 0, "control_garbage_requests": 0, "cache_commands": 0,
    "bad_inputs_planted": 0, "mmap_reads": 0,
}
ERRORS = []


def count(key, n=1):
    with LOCK:
        FIG[key] += n


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp-soak"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def make_tree():
    rng = random.Random(1)
    for i in range(12):
        d = f"{SRC}/team{i % 3}/model{i}"
        for j in range(3):
            write(f"{d}/model-{j:05d}.safetensors", rng.randbytes(rng.randint(1, 6) << 20))
        write(f"{d}/config.json", json.dumps({"model": i}).encode())
        write(f"{d}/tokenizer.json", rng.randbytes(50_000))
    # A training run with nested checkpoints.
    for step in (500, 1000):
        write(f"{SRC}/run7/checkpoint-{step}/model.safetensors", rng.randbytes(2 << 20))
    write(f"{SRC}/run7/model.safetensors", rng.randbytes(3 << 20))


def safetensors_with_header(header):
    body = header.encode()
    return len(body).to_bytes(8, "little") + body


def plant_bad_inputs():
    """Each a file or tree that once crashed, hung or exhausted some
    filesystem; all of them at once, re-planted by the churn."""
    bad = f"{SRC}/bad"
    nested = '{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":' + "[" * 100_000 + "]" * 100_000 + "}}"
    write(f"{bad}/nested/model.safetensors", safetensors_with_header(nested) + b"\0")
    write(f"{bad}/lying-length/model.safetensors", (1 << 62).to_bytes(8, "little") + b"{}")
    write(f"{bad}/truncated/model.safetensors", b"\x10\0\0")
    latin1 = f"{bad}/caf".encode() + b"\xe9"  # a path that is not UTF-8
    os.makedirs(latin1, exist_ok=True)
    with open(latin1 + b"/model.bin", "wb") as f:
        f.write(b"non-utf8 path")
    os.makedirs(f"{bad}/fifo", exist_ok=True)
    write(f"{bad}/fifo/model.bin", b"w")
    fifo = f"{bad}/fifo/extra.bin"
    if not os.path.exists(fifo):
        os.mkfifo(fifo)
    os.makedirs(f"{bad}/escape", exist_ok=True)
    write(f"{bad}/escape/model.bin", b"w")
    for name, target in (("passwd", "/etc/passwd"), ("dangling", "nowhere"), ("loop", "loop")):
        p = f"{bad}/escape/{name}"
        if not os.path.lexists(p):
            os.symlink(target, p)
    write(f"{bad}/empty/model.bin", b"")
    write(f"{bad}/newline/model.bin", b"w")
    write(f"{bad}/newline/a\nb.txt", b"newline in a member name")
    count("bad_inputs_planted", 9)


def recompute_digest(digest_dir):
    """The checkpoint digest of what the mount serves, read in full."""
    lines = []
    total = 0
    for root, dirs, files in os.walk(digest_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            path = os.path.join(root, name)
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
                    total += len(chunk)
            rel = os.path.relpath(path, digest_dir)
            lines.append(f"{h.hexdigest()}  {rel}\n".encode())
    lines.sort(key=lambda line: line.split(b"  ", 1)[1])
    return "sha256-" + hashlib.sha256(b"".join(lines)).hexdigest(), total


def reader(seed):
    rng = random.Random(seed)
    while not STOP.is_set():
        try:
            names = [n for n in os.listdir(MNT) if n.startswith("sha256-")]
        except OSError as e:
            ERRORS.append(f"listing the mount: {e}")
            count("other_read_errors")
            time.sleep(0.1)
            continue
        if not names:
            time.sleep(0.1)
            continue
        name = rng.choice(names)
        d = f"{MNT}/{name}"
        try:
            # Every other visit maps one file instead, the way engines read.
            if rng.random() < 0.5:
                got, n = recompute_digest(d)
                if got != name:
                    count("wrong_digests")
                    ERRORS.append(f"{name} served content whose digest is {got}")
                count("digest_dirs_verified")
                count("bytes_verified", n)
            else:
                _mmap_one(d, rng)
        except OSError as e:
            if e.errno == errno.EIO or e.errno == errno.ENOENT:
                count("eio_reads")  # withdrawn while read: allowed by DESIGN section 2
            else:
                count("other_read_errors")
                ERRORS.append(f"{name}: {e}")


MMAP_CHILD = """
import hashlib, mmap, os, sys
with open(sys.argv[1], "rb") as f:
    size = os.fstat(f.fileno()).st_size
    with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        print(hashlib.sha256(m).hexdigest())
"""


def _mmap_one(d, rng):
    """Maps one member and hashes it through the mapping, in a child: a page
    that cannot be read (EIO) arrives as SIGBUS, which only a child survives."""
    files = [os.path.join(root, n) for root, _, names in os.walk(d) for n in names]
    if not files:
        return
    path = rng.choice(files)
    if os.stat(path).st_size == 0:
        return
    expected = os.getxattr(path, "user.ckptfs.sha256").decode()
    child = subprocess.run([sys.executable, "-c", MMAP_CHILD, path], capture_output=True, text=True)
    if child.returncode == -signal.SIGBUS or child.returncode != 0:
        count("eio_reads")  # withdrawn while mapped
    elif child.stdout.strip() != expected:
        count("wrong_digests")
        ERRORS.append(f"{path}: mapped bytes hash to {child.stdout.strip()}, not {expected}")
    else:
        count("mmap_reads")


def churn():
    rng = random.Random(7)
    version = 0
    while not STOP.is_set():
        version += 1
        i = rng.randrange(12)
        d = f"{SRC}/team{i % 3}/model{i}"
        action = rng.randrange(4)
        if action == 0:  # a fine-tune replaces one shard in place
            write(f"{d}/model-00001.safetensors", rng.randbytes(rng.randint(1, 6) << 20))
        elif action == 1:  # a config edit
            write(f"{d}/config.json", json.dumps({"model": i, "v": version}).encode())
        elif action == 2:  # a new step checkpoint appears in the run
            write(f"{SRC}/run7/checkpoint-{2000 + version}/model.safetensors", rng.randbytes(1 << 20))
        else:  # one goes away, and the bad inputs are planted again
            subprocess.run(["rm", "-rf", f"{SRC}/run7/checkpoint-{2000 + version - 3}", f"{SRC}/bad"], check=False)
            plant_bad_inputs()
        count("churn_versions")
        STOP.wait(rng.uniform(0.5, 3))


def signals(pid):
    while not STOP.is_set():
        for _ in range(50):
            os.kill(pid, signal.SIGHUP)
        count("sighups", 50)
        subprocess.run([CTL, "rescan", MNT], capture_output=True)
        count("rescans")
        STOP.wait(2)


def control_flood():
    sock_path = os.getxattr(MNT, "user.ckptfs.control").decode()
    held = []
    rng = random.Random(3)
    while not STOP.is_set():
        # Idle connections held open, as one misbehaving client would.
        while len(held) < 300:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(sock_path)
                held.append(s)
                count("control_connections")
            except OSError:
                s.close()
                break
        # Garbage and oversized requests.
        for payload in (b"{not json\n", b'{"cmd": 7}\n', b"\xff\xfe\n", b"x" * (2 << 20)):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.settimeout(5)
                s.connect(sock_path)
                s.sendall(payload)
                s.recv(4096)
            except OSError:
                pass
            finally:
                s.close()
            count("control_garbage_requests")
        for args in (["stats", "--json", MNT], ["status", "--json", MNT],
                     ["evict", f"{MNT}/by-name/team0/model0"], ["preload", f"{MNT}/by-name/team1/model1"]):
            subprocess.run([CTL] + args, capture_output=True)
            count("cache_commands")
        if rng.random() < 0.2:
            for s in held[:100]:
                s.close()
            del held[:100]
        STOP.wait(1)
    for s in held:
        s.close()


def vm(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def main():
    make_tree()
    plant_bad_inputs()
    os.makedirs(MNT, exist_ok=True)
    log = f"{WORK}/daemon.log"
    subprocess.run([DAEMON, SRC, MNT, "-o", f"state={STATE},settle=1,rescan=30,cache_size=64M,log_file={log}"],
                   check=True)
    pid = int(json.loads(subprocess.run([CTL, "status", "--json", MNT], capture_output=True,
                                        text=True).stdout)["pid"])
    rss_start = vm(pid, "VmRSS")
    threads = [threading.Thread(target=reader, args=(s,)) for s in range(4)]
    threads += [threading.Thread(target=churn), threading.Thread(target=signals, args=(pid,)),
                threading.Thread(target=control_flood)]
    for t in threads:
        t.start()
    started = time.time()
    peak = 0
    while time.time() - started < DURATION:
        time.sleep(5)
        if not os.path.exists(f"/proc/{pid}"):
            ERRORS.append("the daemon died")
            break
        peak = max(peak, vm(pid, "VmRSS"))
        print(f"[soak] {time.time() - started:6.0f} s  " + json.dumps(FIG), file=sys.stderr, flush=True)
    STOP.set()
    for t in threads:
        t.join()
    alive = os.path.exists(f"/proc/{pid}")
    FIG.update({
        "seconds": round(time.time() - started),
        "daemon_alive_at_end": alive,
        "rss_kib_start": rss_start,
        "rss_kib_end": vm(pid, "VmRSS") if alive else 0,
        "rss_kib_peak_sampled": peak,
        "vm_hwm_kib": vm(pid, "VmHWM") if alive else 0,
        "errors": ERRORS[:20],
    })
    print(json.dumps(FIG, indent=1))
    return 0 if alive and FIG["wrong_digests"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
