#!/usr/bin/env bash
# The fleet on shared storage (issue 15), on one machine: the source tree and
# the manifest store live on an "NFS server" (a directory served by sshd on
# loopback) and every node sees them through sshfs, as nodes see NFS.
#
#  1. Two nodes, each a ckptfs with its own state directory, mount the same
#     GIB GiB tree with one manifests= directory. The first hashes every byte
#     and publishes signed records; the second uses them. For each: time from
#     start to every checkpoint visible, bytes its process read (rchar of
#     /proc/PID/io: source bytes, records and index alike) and SFTP requests
#     the server answered meanwhile. The native peer: sha256sum of the tree
#     through the same sshfs mount (what verifying it costs any node).
#  2. A rescan of an unchanged FILES-file tree on sshfs: time and SFTP
#     requests per rescan, with sshfs's attribute cache (20 s) still warm and
#     once it has expired (as for the 60 s periodic rescan); the same rescan
#     on the local directory, and `ls -lR` through sshfs, as peers.
#
# Usage: bench_fleet.sh [BUILD_DIR=build] [GIB=4] [FILES=10000]
# Run as root, by hand (needs sshfs and openssh-server); everything lives in
# a temporary directory, and is unmounted and stopped by PID at the end.
set -euo pipefail
build=$(realpath "${1:-build}")
gib=${2:-4}
files=${3:-10000}
here=$(dirname "$(realpath "$0")")
loopback=$here/../support/sshfs_loopback.sh
work=$(mktemp -d /tmp/ckptfs-bench-fleet.XXXXXX)
server=$work/server
shared=$work/shared
pids=()
cleanup() {
  for m in "$work"/mnt-*; do mountpoint -q "$m" 2>/dev/null && fusermount3 -u "$m"; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  "$loopback" stop "$work/ssh" || true
  rm -rf "$work"
}
trap cleanup EXIT

now() { date +%s.%N; }
rchar() { awk '/^rchar:/ {print $2}' "/proc/$1/io"; }
requests() { "$loopback" requests "$work/ssh"; }
# status field (a python expression over d, the parsed JSON)
status() { "$build/ckptfsctl" status --json "$1" 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print($2)" 2>/dev/null || echo -1; }

checkpoints=8
shard_mib=$((gib * 1024 / checkpoints / 2))
echo "making $checkpoints checkpoints of 2 x $shard_mib MiB on the server side..."
for c in $(seq 1 "$checkpoints"); do
  d=$server/src/model$c
  mkdir -p "$d"
  for s in 1 2; do head -c "$((shard_mib << 20))" /dev/urandom >"$d/model-0000$s-of-00002.safetensors"; done
  printf '{"model": %d}' "$c" >"$d/config.json"
done
mkdir -p "$server/manifests" "$server/scan"
echo "making $files small files for the rescan..."
python3 - "$server/scan" "$files" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
per = 20
for i in range(n // per):
    d = os.path.join(root, f"team{i % 50}", f"ckpt{i}")
    os.makedirs(d, exist_ok=True)
    for j in range(per):
        name = "model.safetensors" if j == 0 else f"part{j}.json"
        with open(os.path.join(d, name), "w") as f:
            f.write(f"{i} {j}")
PY
"$loopback" start "$work/ssh" "$server" "$shared"
"$build/ckptfsctl" keygen "$work/fleet.key" >/dev/null

# run_node NAME OPTIONS: starts a foreground daemon over the shared source,
# waits until every checkpoint is exposed; sets node_s, node_bytes, node_req.
# (Not in a command substitution: its subshell would run the EXIT trap.)
run_node() {
  local name=$1 opts=$2 mnt=$work/mnt-$1
  mkdir -p "$mnt"
  local r0 t0 pid
  r0=$(requests)
  t0=$(now)
  "$build/ckptfs" "$shared/src" "$mnt" -f \
    -o "state=$work/state-$name,settle=0,rescan=0,manifests=$shared/manifests,$opts" 2>"$work/$name.log" &
  pid=$!
  pids+=("$pid")
  until [ "$(status "$mnt" "d['counts']['exposed']")" = "$checkpoints" ]; do sleep 0.02; done
  local t1 bytes r1
  t1=$(now)
  bytes=$(rchar "$pid")
  r1=$(requests)
  node_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
  node_bytes=$bytes
  node_req=$((r1 - r0))
}

echo
echo "== 1. two nodes, one manifest store, ${gib} GiB tree over sshfs =="
run_node node1 "manifest_sign=$work/fleet.key"
t1s=$node_s b1=$node_bytes q1=$node_req
run_node node2 "manifest_keys=$work/fleet.key.pub"
t2s=$node_s b2=$node_bytes q2=$node_req
r0=$(requests)
t0=$(now)
find "$shared/src" -type f -print0 | xargs -0 sha256sum >/dev/null
t1=$(now)
native_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", b - a}')
native_req=$(($(requests) - r0))
printf '%-34s %10s %16s %14s\n' "" "seconds" "bytes read" "SFTP requests"
printf '%-34s %10s %16s %14s\n' "node 1 (hashes, publishes)" "$t1s" "$b1" "$q1"
printf '%-34s %10s %16s %14s\n' "node 2 (uses the records)" "$t2s" "$b2" "$q2"
printf '%-34s %10s %16s %14s\n' "sha256sum of the tree (peer)" "$native_s" "$((gib << 30))" "$native_req"
awk -v a="$t1s" -v b="$t2s" -v x="$b1" -v y="$b2" -v n="$native_s" 'BEGIN {
  printf "node 2 is %.0fx faster to all-visible than node 1, %.0fx faster than sha256sum; reads %.6f%% of node 1'"'"'s bytes\n",
         a / b, n / b, 100 * y / x }'
for n in node1 node2; do
  echo "$n: $(status "$work/mnt-$n" "d['manifests']")"
done
diff <(cd "$work/mnt-node1/by-name" && find . -type l -printf '%p %l\n' | sort) \
     <(cd "$work/mnt-node2/by-name" && find . -type l -printf '%p %l\n' | sort) >/dev/null &&
  echo "both nodes show the same digests"
for n in node1 node2; do fusermount3 -u "$work/mnt-$n"; done

echo
echo "== 2. rescan of an unchanged $files-file tree =="
# rescan_once MNT: one `ckptfsctl rescan`, timed until the scan count moves;
# sets scan_s and scan_req.
rescan_once() {
  local mnt=$1 before r0 t0
  before=$(status "$mnt" "d['scans']")
  r0=$(requests)
  t0=$(now)
  "$build/ckptfsctl" rescan "$mnt" >/dev/null
  until [ "$(status "$mnt" "d['scans']")" -gt "$before" ]; do sleep 0.01; done
  scan_s=$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.3f", b - a}')
  scan_req=$(($(requests) - r0))
}
for where in sshfs local; do
  src=$shared/scan
  [ "$where" = local ] && src=$server/scan
  mnt=$work/mnt-scan-$where
  mkdir -p "$mnt"
  "$build/ckptfs" "$src" "$mnt" -f -o "state=$work/state-scan-$where,settle=0,rescan=0" 2>"$work/scan-$where.log" &
  pids+=($!)
  until [ "$(status "$mnt" "d['counts']['pending'] + d['counts']['indexing']")" = 0 ] &&
        [ "$(status "$mnt" "d['counts']['exposed']")" = "$((files / 20))" ]; do sleep 0.1; done
  rescan_once "$mnt"
  warm_s=$scan_s warm_q=$scan_req
  if [ "$where" = sshfs ]; then
    sleep 21  # past sshfs's 20 s attribute and directory cache
    rescan_once "$mnt"
    cold_s=$scan_s cold_q=$scan_req
    echo "sshfs: rescan ${warm_s} s, ${warm_q} SFTP requests (sshfs cache warm); ${cold_s} s, ${cold_q} requests (cache expired)"
  else
    echo "local: rescan ${warm_s} s"
    local_s=$warm_s
  fi
  fusermount3 -u "$mnt"
done
sleep 21
r0=$(requests)
t0=$(now)
ls -lR "$shared/scan" >/dev/null
ls_s=$(awk -v a="$t0" -v b="$(now)" 'BEGIN {printf "%.3f", b - a}')
echo "ls -lR through sshfs (cache expired): ${ls_s} s, $(($(requests) - r0)) SFTP requests"
awk -v c="$cold_s" -v l="$local_s" -v s="$ls_s" 'BEGIN {
  printf "ratios: sshfs rescan (cache expired) / local rescan %.1f; / ls -lR through sshfs %.2f\n", c / l, c / s }'
