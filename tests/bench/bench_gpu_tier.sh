#!/usr/bin/env bash
# Does the GPU chunk tier make a reader faster? (issue 23, item 4: prove it
# or retire it; this script goes with the tier if it is retired.) By
# default with gpu=sim, whose "device" is host memory copied with memcpy;
# GPU=0 uses CUDA device 0, whose copy back crosses PCIe instead.
#   [GPU=sim|INDEX] tests/bench/bench_gpu_tier.sh BUILD_DIR [SIZE_MIB=1024]   (as root, after scripts/build.sh)
# One SIZE_MIB shard, sources in the page cache, the mount's kernel cache
# dropped before every read (fadvise DONTNEED), best of 3, MiB/s:
#   chunks, re-read from source   fill=off, 256 MiB chunk cache, no GPU tier
#   chunks, re-read from GPU tier the same plus gpu=$GPU, gpu_cache_size=2G:
#                                 every chunk evicted from the chunk cache is
#                                 in the GPU tier and is copied back from it
#   host tier (passthrough)       the default mount, the file resident
set -euo pipefail
build=$(realpath "$1"); size=${2:-1024}; gpu=${GPU:-sim}
work=$(mktemp -d /tmp/ckptfs-gpubench.XXXXXX)
mnts=("$work/plain" "$work/gpu" "$work/host")
cleanup() { for m in "${mnts[@]}"; do mountpoint -q "$m" && fusermount3 -u "$m"; done; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/src/m" "${mnts[@]}"
head -c "${size}M" /dev/urandom > "$work/src/m/model.safetensors"
cat "$work/src/m/model.safetensors" > /dev/null
"$build/ckptfs" "$work/src" "$work/plain" -o "state=$work/s1,settle=0,fill=off,cache_size=256M"
"$build/ckptfs" "$work/src" "$work/gpu" -o "state=$work/s2,settle=0,fill=off,cache_size=256M,gpu=$gpu,gpu_cache_size=2G"
"$build/ckptfs" "$work/src" "$work/host" -o "state=$work/s3,settle=0,cache_size=4G"
file() { echo "$1/$(readlink "$1/by-name/m" | sed 's|^\.\./||')/model.safetensors"; }
for m in "${mnts[@]}"; do for _ in $(seq 600); do [ -L "$m/by-name/m" ] && break; sleep 0.1; done; done
now() { date +%s.%N; }
read_once() { dd if="$1" iflag=nocache count=0 status=none; local a b; a=$(now); dd if="$1" of=/dev/null bs=1M status=none; b=$(now); awk -v a="$a" -v b="$b" 'BEGIN{print b-a}'; }
best() { local f=$1 t best=; dd if="$f" of=/dev/null bs=1M status=none; for _ in 1 2 3; do t=$(read_once "$f"); best=$(awk -v a="$t" -v b="$best" 'BEGIN{ if (b=="" || a<b) print a; else print b }'); done; echo "$best"; }
tn=$(for _ in 1 2 3; do a=$(now); dd if="$work/src/m/model.safetensors" of=/dev/null bs=1M status=none; b=$(now); awk -v a="$a" -v b="$b" 'BEGIN{print b-a}'; done | sort -n | head -1)
tp=$(best "$(file "$work/plain")")
tg=$(best "$(file "$work/gpu")")
th=$(best "$(file "$work/host")")
"$build/ckptfsctl" stats --json "$work/gpu" | python3 -c 'import json,sys; t=json.load(sys.stdin)["tiers"]; print("gpu tier after the runs:", {k: t["gpu"][k] for k in ("used","hits","misses","fills")}, " chunks:", {k: t["chunks"][k] for k in ("capacity","hits","misses","evictions")})'
printf '%-34s %8s %8s\n' "read of a ${size} MiB shard" "MiB/s" "/native"
for row in "native (page cache):$tn" "chunks, re-read from source:$tp" "chunks, re-read from gpu=$gpu:$tg" "host tier (passthrough):$th"; do
  awk -v n="${row%%:*}" -v t="${row##*:}" -v tn="$tn" -v s="$size" 'BEGIN{printf "%-34s %8.0f %8.2f\n", n, s/t, tn/t}'
done
