#!/usr/bin/env bash
# Benchmark of hashing one large shard (issue 20 item 4). Run by hand, as
# root, after a build:
#   tests/bench/bench_hash_large.sh [SIZES_MIB="256 1024 4096"] [OLD_CTL]
# For each size, one random file alone in a checkpoint, timed in one run, best
# of 3, with its page cache dropped (cold: POSIX_FADV_DONTNEED on the file, so
# the disk is read) and warm:
#   ckptfsctl digest    the file's SHA-256 and chunk table, empty index
#   old ckptfsctl       the same with OLD_CTL (e.g. /work/main/build/ckptfsctl),
#                       when given: the serial read + hash of before
#   sha256sum FILE      coreutils
#   openssl dgst        openssl dgst -sha256 FILE
# and reports seconds, GB/s and the ratio of each to ckptfsctl (above 1:
# ckptfsctl is faster). A single file's SHA-256 is serial: the best any tool
# can do is the slower of the disk and one core's SHA-256.
set -euo pipefail
cd "$(dirname "$0")/../.."
sizes=${1:-"256 1024 4096"}
old_ctl=${2:-}
ctl=build/ckptfsctl
[ -x "$ctl" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }

work=$(mktemp -d /var/tmp/ckptfs-bench-hash.XXXXXX)
trap 'rm -rf "$work"' EXIT

now() { date +%s.%N; }
drop() { python3 -c 'import os,sys
fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$1"; }
warm() { cat "$1" >/dev/null; }
# best STATE FILE CMD...: best of 3 wall seconds of CMD with FILE cold or warm.
best() {
  local state=$1 file=$2 b=
  shift 2
  for _ in 1 2 3; do
    rm -rf "$work/state"
    if [ "$state" = cold ]; then drop "$file"; else warm "$file"; fi
    local t0 t1; t0=$(now); "$@" >/dev/null; t1=$(now)
    b=$(awk -v a="$t0" -v c="$t1" -v b="$b" 'BEGIN { d = c - a; if (b == "" || d < b) print d; else print b }')
  done
  echo "$b"
}
gbs() { awk -v s="$1" -v t="$2" 'BEGIN { printf "%.2f", s / t / 1e9 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo "$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); SHA extensions: $(grep -qw sha_ni /proc/cpuinfo && echo yes || echo no)"
printf '%-6s %-5s %-18s %8s %7s %s\n' "MiB" "cache" "tool" "seconds" "GB/s" "its time / ckptfsctl's"
for mib in $sizes; do
  mkdir -p "$work/src/m$mib"
  f="$work/src/m$mib/model.safetensors"
  head -c "${mib}M" /dev/urandom >"$f"
  bytes=$((mib * 1024 * 1024))
  for state in cold warm; do
    t_ck=$(best $state "$f" "$ctl" -q --state "$work/state" digest "$work/src/m$mib")
    printf '%-6s %-5s %-18s %8.3f %7s %s\n' "$mib" "$state" "ckptfsctl digest" "$t_ck" "$(gbs $bytes "$t_ck")" "1.00"
    if [ -n "$old_ctl" ]; then
      t=$(best $state "$f" "$old_ctl" -q --state "$work/state" digest "$work/src/m$mib")
      printf '%-6s %-5s %-18s %8.3f %7s %s\n' "$mib" "$state" "old ckptfsctl" "$t" "$(gbs $bytes "$t")" "$(ratio "$t" "$t_ck")"
    fi
    t=$(best $state "$f" sha256sum "$f")
    printf '%-6s %-5s %-18s %8.3f %7s %s\n' "$mib" "$state" "sha256sum" "$t" "$(gbs $bytes "$t")" "$(ratio "$t" "$t_ck")"
    t=$(best $state "$f" openssl dgst -sha256 "$f")
    printf '%-6s %-5s %-18s %8.3f %7s %s\n' "$mib" "$state" "openssl dgst" "$t" "$(gbs $bytes "$t")" "$(ratio "$t" "$t_ck")"
  done
  rm -f "$f"
done
