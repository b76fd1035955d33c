#!/usr/bin/env bash
# Benchmark of indexing many small files (issue 20 item 4, the other end).
# Run by hand after a build:
#   tests/bench/bench_index_small.sh [CHECKPOINTS=2000] [FILES_PER=10] [OLD_CTL]
# Writes CHECKPOINTS step checkpoints of FILES_PER files of 4 KB (20,000 by
# default), page cache warm, and times in one run, best of 3:
#   ckptfsctl digest    on an empty index (walk, SHA-256, chunk tables, and
#                       every row written to the index)
#   old ckptfsctl       the same with OLD_CTL (e.g. /work/main/build/ckptfsctl)
#   sha256sum           find | xargs -P2 sha256sum over the same files
# and reports each with its ratio to sha256sum, plus the user and system CPU
# seconds (on a shared machine the CPU time is the steadier figure).
set -euo pipefail
cd "$(dirname "$0")/../.."
checkpoints=${1:-2000}
per=${2:-10}
old_ctl=${3:-}
ctl=$PWD/build/ckptfsctl
[ -x "$ctl" ] || { echo "build first: scripts/build.sh" >&2; exit 1; }

work=$(mktemp -d /var/tmp/ckptfs-bench-small.XXXXXX)
trap 'rm -rf "$work"' EXIT
python3 - "$work/src" "$checkpoints" "$per" <<'PY'
import os, sys
root, n, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for c in range(n):
    d = f"{root}/step-{c:05d}"
    os.makedirs(d, exist_ok=True)
    for i in range(per):
        with open(f"{d}/part-{i}.bin", "wb") as f:
            f.write(os.urandom(4096))
PY
find "$work/src" -type f -exec cat {} + >/dev/null  # page cache

# best CMD...: "wall user sys" of the fastest of 3 runs, each on an empty index.
best() {
  local b=
  for _ in 1 2 3; do
    rm -rf "$work/state"
    /usr/bin/time -o "$work/time" -f '%e %U %S' "$@" >/dev/null 2>&1
    b=$(printf '%s\n%s\n' "$(cat "$work/time")" "$b" | grep . | sort -g | head -1)
  done
  echo "$b"
}
cd "$work"
t_sha=$(best sh -c 'find src -type f | xargs -P2 sha256sum')
t_ck=$(best "$ctl" -q --state "$work/state" digest src)
[ -n "$old_ctl" ] && t_old=$(best "$old_ctl" -q --state "$work/state" digest src)
row() {
  read -r wall user sys <<<"$2"
  read -r swall _ <<<"$t_sha"
  printf '%-34s %7.2f %7.2f %7.2f %8s\n' "$1" "$wall" "$user" "$sys" "$(awk -v a="$wall" -v b="$swall" 'BEGIN{printf "%.2f", a/b}')"
}
echo "$((checkpoints * per)) files of 4 KB in $checkpoints checkpoints, page cache warm, $(nproc) CPUs, best of 3"
printf '%-34s %7s %7s %7s %8s\n' "run" "wall s" "user s" "sys s" "wall / sha256sum"
row "ckptfsctl digest (empty index)" "$t_ck"
[ -n "$old_ctl" ] && row "old ckptfsctl digest (empty index)" "$t_old"
row "find | xargs -P2 sha256sum" "$t_sha"
