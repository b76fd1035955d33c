#!/usr/bin/env bash
# Benchmark of the verified chunk tier (issue: the chunk cache). Run by hand,
# as root, after scripts/build.sh:   tests/bench/bench_cache.sh [SIZE_MIB=2048]
#
# One shard of SIZE_MIB read, in one run, natively, through ckptfs, bindfs,
# squashfuse (over a squashfs image of the same directory) and a minimal
# memory-backed FUSE filesystem (ckptfs-bench-memfs: the ceiling for any FUSE
# read here). Sources are in the page cache; before every case the kernel's
# cache of the mount is dropped (fadvise DONTNEED on the file), so each read
# really goes through the filesystem:
#   cold   ckptfs's chunk cache empty (evicted before each try)
#   warm   ckptfs's chunk cache holding the file
# for buffered reads (dd bs=1M) and mmap of every page. Best of 3, reported as
# throughput ratios to native. Then the time to load every tensor of a
# 1.2 GB safetensors checkpoint through the mount, cold and after
# `ckptfsctl preload --pin`.
set -euo pipefail
cd "$(dirname "$0")/../.."
size_mib=${1:-2048}
[ -x build/ckptfs ] && [ -x build/tests/ckptfs-bench-memfs ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
need=()
for t in bindfs squashfuse mksquashfs; do command -v $t >/dev/null || need+=($t); done
if [ ${#need[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bindfs squashfuse squashfs-tools >/dev/null
fi

work=$(mktemp -d /tmp/ckptfs-bench.XXXXXX)
mounts=("$work/ckptfs" "$work/bindfs" "$work/squashfuse" "$work/memfs")
cleanup() {
  for m in "${mounts[@]}"; do mountpoint -q "$m" && fusermount3 -u "$m"; done
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/src/m" "${mounts[@]}"
echo "writing a ${size_mib} MiB shard and a 1.2 GB safetensors checkpoint ..." >&2
head -c "${size_mib}M" /dev/urandom >"$work/src/m/model.safetensors"
python3 - "$work/src/st" <<'PY'
import json, os, struct, sys
os.makedirs(sys.argv[1], exist_ok=True)
for s in range(4):  # 4 shards x 18 tensors x 16 MiB = 1.2 GB
    header, blobs, off = {}, [], 0
    for t in range(18):
        blob = os.urandom(16 << 20)
        header[f"layers.{s * 18 + t}.weight"] = {"dtype": "F32", "shape": [len(blob) // 4], "data_offsets": [off, off + len(blob)]}
        blobs.append(blob); off += len(blob)
    h = json.dumps(header).encode(); h += b" " * (-len(h) % 8)
    with open(os.path.join(sys.argv[1], f"model-{s + 1:05d}-of-00004.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h)
        for b in blobs: f.write(b)
PY
mksquashfs "$work/src" "$work/image.sqfs" -noappend -quiet >/dev/null
cat "$work/src/m/model.safetensors" "$work/src/st/"* "$work/image.sqfs" >/dev/null   # page cache

# fill=off and fill_on_index=off: every read goes to the chunk tier (with the
# defaults, files would be copied whole into the host tier and passed
# through, which bench_passthrough.sh measures).
build/ckptfs "$work/src" "$work/ckptfs" -o "state=$work/state,settle=0,cache_size=4G,fill=off,fill_on_index=off"
bindfs -o ro "$work/src" "$work/bindfs"
squashfuse "$work/image.sqfs" "$work/squashfuse"
build/tests/ckptfs-bench-memfs "$work/src/m/model.safetensors" "$work/memfs" 4096
for _ in $(seq 1 600); do [ -L "$work/ckptfs/by-name/st" ] && [ -L "$work/ckptfs/by-name/m" ] && break; sleep 0.1; done
ck="$work/ckptfs/$(readlink "$work/ckptfs/by-name/m" | sed 's|^\.\./||')/model.safetensors"

declare -A file=(
  [native]="$work/src/m/model.safetensors" [ckptfs]="$ck" [bindfs]="$work/bindfs/m/model.safetensors"
  [squashfuse]="$work/squashfuse/m/model.safetensors" [memfs]="$work/memfs/data"
)
now() { date +%s.%N; }
drop_mount_cache() { dd if="$1" iflag=nocache count=0 status=none; }
one() {  # one KIND FILE -> seconds
  case $1 in
    read) local t0 t1; t0=$(now); dd if="$2" of=/dev/null bs=1M status=none; t1=$(now); awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}' ;;
    mmap) build/tests/ckptfs-bench-mmap "$2" ;;
  esac
}
best() {  # best FS KIND STATE
  local fs=$1 kind=$2 state=$3 best= t
  for _ in 1 2 3; do
    if [ "$fs" = ckptfs ] && [ "$state" = cold ]; then build/ckptfsctl evict "$ck" >/dev/null; fi
    if [ "$fs" = ckptfs ] && [ "$state" = warm ]; then build/ckptfsctl preload "$ck" >/dev/null; fi
    [ "$fs" != native ] && drop_mount_cache "${file[$fs]}"
    t=$(one "$kind" "${file[$fs]}")
    best=$(awk -v a="$t" -v b="$best" 'BEGIN{ if (b=="" || a<b) print a; else print b }')
  done
  echo "$best"
}

echo
echo "${size_mib} MiB shard; sources in the page cache; each mount's kernel cache dropped before every try; best of 3"
printf '%-22s %9s %9s %9s %9s %9s   %s\n' "case (MiB/s)" native ckptfs bindfs squashfuse memfs "ckptfs/native ckptfs/memfs"
for kind in read mmap; do
  tn=$(best native $kind -)
  tm=$(best memfs $kind -)
  tb=$(best bindfs $kind -)
  ts=$(best squashfuse $kind -)
  for state in cold warm; do
    tc=$(best ckptfs $kind $state)
    awk -v c="$kind, ckptfs $state" -v n="$tn" -v k="$tc" -v b="$tb" -v s="$ts" -v m="$tm" -v mib="$size_mib" 'BEGIN {
      printf "%-22s %9.0f %9.0f %9.0f %9.0f %9.0f   %.2f %.2f\n", c, mib/n, mib/k, mib/b, mib/s, mib/m, n/k, m/k }'
  done
done

st="$work/ckptfs/by-name/st"
load() {  # load STATE: drop the mount's kernel cache, then time the loader
  [ "$1" = cold ] && build/ckptfsctl evict "$st" >/dev/null
  for f in "$st"/*.safetensors; do drop_mount_cache "$f"; done
  python3 tests/bench/load_safetensors.py "$st" | cut -d' ' -f1
}
# The very first fill of fresh cache memory also pays for allocating and
# locking it (mlock populates and zeroes each 64 MiB slab); later cold loads
# reuse the slabs. Both are reported.
first=$(load cold)
cold=$(for _ in 1 2 3; do load cold; done | sort -n | head -1)
build/ckptfsctl preload --pin "$st" >/dev/null
pinned=$(for _ in 1 2 3; do load pinned; done | sort -n | head -1)
native=$(for _ in 1 2 3; do python3 tests/bench/load_safetensors.py "$work/src/st" | cut -d' ' -f1; done | sort -n | head -1)
echo
echo "loading every tensor of a 1.2 GB safetensors checkpoint (mmap + copy), seconds (best of 3):"
echo "  native (page cache)                                  $native"
echo "  ckptfs, first load (cache memory not yet allocated)  $first"
echo "  ckptfs, cold (cache empty, its memory reserved)      $cold"
echo "  ckptfs, after preload --pin                          $pinned"
