#!/usr/bin/env bash
# Read benchmark of the daemon (issue: the daemon). Run by hand, as root, after
# scripts/build.sh:   tests/bench/bench_read.sh [SIZE_MIB=2048]
# One shard of SIZE_MIB, read natively, through bindfs over the same
# directory, and through ckptfs, in one run:
#   cold buffered   page cache dropped (and ckptfs's chunk cache evicted), dd bs=1M
#   cold O_DIRECT   page cache dropped, dd bs=1M iflag=direct
#   cold mmap       page cache dropped, one byte of every page through mmap
#   warm buffered   the same file read again (the kernel's cache)
#   warm mmap
# Each case is the best of 3; reported as throughput ratio to native
# (higher is better; 1.00 = as fast as reading the file directly).
set -euo pipefail
cd "$(dirname "$0")/../.."
size_mib=${1:-2048}
[ -x build/ckptfs ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
command -v bindfs >/dev/null && command -v fio >/dev/null || {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bindfs fio >/dev/null; }

work=$(mktemp -d /tmp/ckptfs-bench.XXXXXX)
cleanup() {
  for m in "$work/ckptfs" "$work/bindfs"; do mountpoint -q "$m" && fusermount3 -u "$m"; done
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/src/m" "$work/ckptfs" "$work/bindfs"
echo "writing a ${size_mib} MiB shard ..." >&2
head -c "${size_mib}M" /dev/urandom >"$work/src/m/model.safetensors"
echo '{}' >"$work/src/m/config.json"

build/ckptfs "$work/src" "$work/ckptfs" -o "state=$work/state,settle=0"
bindfs -o ro "$work/src" "$work/bindfs"
for _ in $(seq 1 600); do [ -L "$work/ckptfs/by-name/m" ] && break; sleep 0.1; done
[ -L "$work/ckptfs/by-name/m" ] || { echo "ckptfs did not index the shard" >&2; exit 1; }
digest=$(readlink "$work/ckptfs/by-name/m" | sed 's|^\.\./||')

declare -A file=(
  [native]="$work/src/m/model.safetensors"
  [bindfs]="$work/bindfs/m/model.safetensors"
  [ckptfs]="$work/ckptfs/$digest/model.safetensors"
)
# Cold means cold for everyone: the kernel's caches and ckptfs's own chunk
# cache (which drop_caches does not touch) are emptied.
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; build/ckptfsctl evict "${file[ckptfs]}" >/dev/null; }
now() { date +%s.%N; }
time_cmd() { local t0 t1; t0=$(now); "$@" >/dev/null 2>&1; t1=$(now); awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}'; }
case_time() {  # case_time CASE FILE -> best of 3 seconds
  local c=$1 f=$2 best= t
  for _ in 1 2 3; do
    case $c in
      cold-buffered) drop; t=$(time_cmd dd if="$f" of=/dev/null bs=1M) ;;
      cold-direct)   drop; t=$(time_cmd dd if="$f" of=/dev/null bs=1M iflag=direct) ;;
      cold-mmap)     drop; t=$(build/tests/ckptfs-bench-mmap "$f") ;;
      warm-buffered) cat "$f" >/dev/null; t=$(time_cmd dd if="$f" of=/dev/null bs=1M) ;;
      warm-mmap)     cat "$f" >/dev/null; t=$(build/tests/ckptfs-bench-mmap "$f") ;;
    esac
    best=$(awk -v a="$t" -v b="$best" 'BEGIN{ if (b=="" || a<b) print a; else print b }')
  done
  echo "$best"
}

bdi=$(awk -v m="$work/ckptfs" '$5==m {print $3}' /proc/self/mountinfo)
echo
echo "${size_mib} MiB shard, best of 3; ckptfs read_ahead_kb=$(cat /sys/class/bdi/$bdi/read_ahead_kb 2>/dev/null || echo '?')"
printf '%-14s %10s %10s %10s   %s\n' "case (MiB/s)" native bindfs ckptfs "throughput ratio to native: bindfs ckptfs"
for c in cold-buffered cold-direct cold-mmap warm-buffered warm-mmap; do
  tn=$(case_time $c "${file[native]}")
  tb=$(case_time $c "${file[bindfs]}")
  tc=$(case_time $c "${file[ckptfs]}")
  awk -v c=$c -v n="$tn" -v b="$tb" -v k="$tc" -v mib="$size_mib" 'BEGIN {
    printf "%-14s %10.0f %10.0f %10.0f   %.2f %.2f\n", c, mib/n, mib/b, mib/k, n/b, n/k }'
done
