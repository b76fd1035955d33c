#!/usr/bin/env python3
"""Loads every tensor of every *.safetensors file in a directory the way a
safetensors loader does (mmap, then a copy of each tensor's bytes), and prints
the seconds it took. Usage: load_safetensors.py DIR"""
import json, mmap, os, struct, sys, time

start = time.monotonic()
total = 0
for name in sorted(os.listdir(sys.argv[1])):
    if not name.endswith(".safetensors"):
        continue
    with open(os.path.join(sys.argv[1], name), "rb") as f:
        m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        (n,) = struct.unpack("<Q", m[:8])
        header = json.loads(m[8:8 + n])
        for key, meta in header.items():
            if key == "__metadata__":
                continue
            b, e = meta["data_offsets"]
            total += len(bytes(m[8 + n + b:8 + n + e]))
        m.close()
print(f"{time.monotonic() - start:.6f} {total}")
