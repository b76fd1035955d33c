#!/usr/bin/env bash
# What verify=sha256 costs against verify=xxh3 (issue 21, storage you do not
# trust). Run by hand, as root, after the build:
#   tests/bench/bench_verify.sh [MIB=2048] [RUNS=3]
#
# One MIB file (and the same as 4 shards of MIB/4, copied together):
#   1. a fill into the host tier (ckptfsctl preload; wall time), source in
#      the page cache and dropped (fadvise DONTNEED on the file);
#   2. a first read through the chunk path (fill=off, dd bs=4M), which under
#      sha256 checks each chunk against the file's SHA-256 chain (a daemon
#      from before the chain first proved the file with a pass over all of
#      it: run this script from an older checkout to compare).
# Best of RUNS each; the ratio is sha256's time over xxh3's.
set -euo pipefail
cd "$(dirname "$0")/../.."
mib=${1:-2048}
runs=${2:-3}
[ -x build/ckptfs ] || { echo "build first" >&2; exit 1; }
work=$(mktemp -d /var/tmp/ckptfs-bench-verify.XXXXXX)
ck="$work/mnt"
cleanup() {
  mountpoint -q "$ck" && fusermount3 -u "$ck"
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/src/one" "$work/src/four" "$ck"
head -c "${mib}M" /dev/urandom >"$work/src/one/model.safetensors"
for i in 1 2 3 4; do head -c "$((mib / 4))M" /dev/urandom >"$work/src/four/model-0000$i-of-00004.safetensors"; done

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f\n", b-a}'; }
drop() { python3 -c 'import os,sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"; }
warm() { cat "$@" >/dev/null; }
mount_ckptfs() {
  mountpoint -q "$ck" && fusermount3 -u "$ck"
  build/ckptfs "$work/src" "$ck" -o "state=$work/state,settle=0,rescan=0,cache_size=$((mib * 3))M,$1"
  for _ in $(seq 1 1200); do [ -L "$ck/by-name/one" ] && [ -L "$ck/by-name/four" ] && return; sleep 0.1; done
  echo "ckptfs did not show the checkpoints" >&2; exit 1
}
digest_dir() { echo "$ck/$(readlink "$ck/by-name/$1" | sed 's|^\.\./||')"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
fill_time() {  # VERIFY CHECKPOINT cold|warm
  local t0
  mount_ckptfs "verify=$1,fill=wait"
  if [ "$3" = cold ]; then drop "$work/src/$2"/*; else warm "$work/src/$2"/*; fi
  t0=$(now)
  build/ckptfsctl preload "$ck/by-name/$2" >/dev/null
  secs "$t0" "$(now)"
}
chunk_read_time() {  # VERIFY cold|warm
  local t0
  mount_ckptfs "verify=$1,fill=off"
  if [ "$2" = cold ]; then drop "$work/src/one"/*; else warm "$work/src/one"/*; fi
  t0=$(now)
  dd if="$(digest_dir one)/model.safetensors" of=/dev/null bs=4M status=none
  secs "$t0" "$(now)"
}
best() { sort -g | head -1; }

mount_ckptfs "fill=off"  # index once
printf '%-52s %8s %8s %6s\n' "case (seconds, best of $runs)" xxh3 sha256 ratio
for source in warm cold; do
  for cp in one four; do
    x=$(for _ in $(seq "$runs"); do fill_time xxh3 $cp $source; done | best)
    s=$(for _ in $(seq "$runs"); do fill_time sha256 $cp $source; done | best)
    label="fill, $([ $cp = one ] && echo "1 file of $mib MiB" || echo "4 files of $((mib / 4)) MiB"), source $source"
    printf '%-52s %8s %8s %6s\n' "$label" "$x" "$s" "$(ratio "$s" "$x")"
  done
  x=$(for _ in $(seq "$runs"); do chunk_read_time xxh3 $source; done | best)
  s=$(for _ in $(seq "$runs"); do chunk_read_time sha256 $source; done | best)
  printf '%-52s %8s %8s %6s\n' "chunk path, first read of $mib MiB, source $source" "$x" "$s" "$(ratio "$s" "$x")"
done
