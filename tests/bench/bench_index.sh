#!/usr/bin/env bash
# Benchmark of the indexer (issue: foundation). Run by hand, as root, after a build:
#   tests/bench/bench_index.sh [SIZE_GIB=4] [SHARDS=8]
# Writes a tree of SHARDS safetensors-named shards totalling SIZE_GIB GiB, warms
# the page cache, then times in one run, each best of 3:
#   ckptfs   ckptfsctl digest with an empty index (SHA-256 + chunk tables)
#   sha256sum over the same files (coreutils, one process)
#   openssl  openssl dgst -sha256, one process per file, $(nproc) in parallel
# and reports each as a ratio to the openssl run. Then times a re-run over the
# unchanged tree, and a re-run over a tree of 1,000 small files.
set -euo pipefail
cd "$(dirname "$0")/../.."
size_gib=${1:-4}
shards=${2:-8}
ctl=build/ckptfsctl
[ -x "$ctl" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }

work=$(mktemp -d /tmp/ckptfs-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/model" "$work/many"
per_shard_mib=$((size_gib * 1024 / shards))
echo "writing $shards shards of $per_shard_mib MiB into $work/src/model ..." >&2
for i in $(seq 1 "$shards"); do
  head -c "${per_shard_mib}M" /dev/urandom >"$work/src/model/$(printf 'model-%05d-of-%05d.safetensors' "$i" "$shards")"
done
echo '{"hidden_size": 4096}' >"$work/src/model/config.json"
for i in $(seq 1 1000); do
  d="$work/many/ckpt-$((i % 50))"
  mkdir -p "$d"
  head -c 4096 /dev/urandom >"$d/part-$i.bin"
done
cat "$work"/src/model/* >/dev/null   # page cache

now() { date +%s.%N; }
best_of_3() {  # best_of_3 SETUP CMD: prints the best wall time of CMD in seconds
  local setup=$1 cmd=$2 best=
  for _ in 1 2 3; do
    eval "$setup"
    local t0 t1; t0=$(now); eval "$cmd" >/dev/null; t1=$(now)
    best=$(echo "$t0 $t1 $best" | awk '{d=$2-$1; if ($3=="" || d<$3) print d; else print $3}')
  done
  echo "$best"
}

files="$work/src/model"
t_ckptfs=$(best_of_3 "rm -rf $work/state" "$ctl -q --state $work/state digest $work/src")
t_sha256sum=$(best_of_3 ":" "sha256sum $files/*")
t_openssl=$(best_of_3 ":" "ls $files/* | xargs -P $(nproc) -n 1 openssl dgst -sha256")
t_rerun=$(best_of_3 ":" "$ctl -q --state $work/state digest $work/src")
$ctl -q --state "$work/state-many" digest "$work/many" >/dev/null
t_rerun_many=$(best_of_3 ":" "$ctl -q --state $work/state-many digest $work/many")

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo
echo "indexing ${size_gib} GiB in ${shards} shards, page cache warm, $(nproc) CPUs, best of 3"
printf '%-34s %8s  %s\n' "run" "seconds" "ratio to openssl (lower is faster)"
printf '%-34s %8.3f  %s\n' "ckptfsctl digest (cold index)" "$t_ckptfs" "$(ratio "$t_ckptfs" "$t_openssl")"
printf '%-34s %8.3f  %s\n' "sha256sum" "$t_sha256sum" "$(ratio "$t_sha256sum" "$t_openssl")"
printf '%-34s %8.3f  %s\n' "openssl dgst -sha256 x$(nproc)" "$t_openssl" "1.00"
echo
printf 'ckptfs is %.2fx faster than sha256sum\n' "$(ratio "$t_sha256sum" "$t_ckptfs")"
printf 're-run over the unchanged tree (%d files): %.3f s\n' "$((shards + 1))" "$t_rerun"
printf 're-run over 1,000 unchanged files in 50 checkpoints: %.3f s\n' "$t_rerun_many"
