#!/usr/bin/env bash
# Mount-to-ready with a warm index: how long `ckptfs SRC MNT` (daemonized, as
# mount(8) runs it) takes to return, now that it returns only once every
# indexed checkpoint is visible (DESIGN.md section 2, "ready means ready").
# For comparison in the same run: `ls -R` of the same source tree, the
# least any tool that looks at every checkpoint must pay.
# Usage: bench_mount_ready.sh [BUILD_DIR=build] COUNT...   (e.g. 1000 10000)
# Run as root, by hand; it mounts under a temporary directory and unmounts.
set -euo pipefail
build=${1:-build}
shift || true
counts=("${@:-1000}")
work=$(mktemp -d /tmp/ckptfs-bench-ready.XXXXXX)
cleanup() {
  mountpoint -q "$work/mnt" && fusermount3 -u "$work/mnt"
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/mnt"
for n in "${counts[@]}"; do
  rm -rf "$work/src" "$work/state"
  for i in $(seq 1 "$n"); do
    d="$work/src/team$((i % 100))/model$i"
    mkdir -p "$d"
    printf 'weights %d' "$i" >"$d/model.safetensors"
    printf '{"i": %d}' "$i" >"$d/config.json"
  done
  "$build/ckptfsctl" --state "$work/state" digest "$work/src" >/dev/null  # warm the index
  sync
  start=$(date +%s.%N)
  "$build/ckptfs" "$work/src" "$work/mnt" -o "state=$work/state,settle=0" 2>/dev/null
  ready=$(date +%s.%N)
  shown=$(find "$work/mnt/by-name" -mindepth 2 -maxdepth 2 -type l | wc -l)
  fusermount3 -u "$work/mnt"
  ls_start=$(date +%s.%N)
  ls -R "$work/src" >/dev/null
  ls_end=$(date +%s.%N)
  awk -v n="$n" -v s="$start" -v r="$ready" -v shown="$shown" -v a="$ls_start" -v b="$ls_end" 'BEGIN {
    printf "%6d checkpoints: mount returned in %.3f s with %d of them visible; ls -R of SRC %.3f s (ratio %.1f)\n",
           n, r - s, shown, b - a, (r - s) / (b - a) }'
  sleep 0.5
done
