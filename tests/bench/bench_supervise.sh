#!/usr/bin/env bash
# What supervision costs on the request path (issue 22, item 1). Run by hand,
# as root, after scripts/build.sh:
#   tests/bench/bench_supervise.sh [ROUNDS=5] [SECONDS_PER_RUN=8]
#
# 4 KiB O_DIRECT random reads (fio, psync, 4 jobs) of a 1 GiB file on the
# chunk path (fill=off: every read is a request to the daemon), through
# ckptfs with supervise=on and with supervise=off, in interleaved rounds of
# one run each (their order alternating), so that both see the same machine. Also, once per round,
# bindfs (a FUSE peer that forwards each read to the same file, also
# O_DIRECT) and the native file from the page cache (O_DIRECT on the native
# file would measure the disk instead), for scale. Reported: IOPS of each run, and per round the ratio
# supervise=on / supervise=off; the goal is a median of at least 0.95.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
secs=${2:-8}
[ -x build/ckptfs ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
need=()
for t in fio bindfs; do command -v $t >/dev/null || need+=($t); done
if [ ${#need[@]} -gt 0 ]; then DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio bindfs >/dev/null; fi

work=$(mktemp -d /tmp/ckptfs-bench-sup.XXXXXX)
ck="$work/ckptfs"
bf="$work/bindfs"
cleanup() {
  for m in "$ck" "$bf"; do mountpoint -q "$m" && fusermount3 -u "$m"; done
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/src/m" "$ck" "$bf"
head -c 1G /dev/urandom >"$work/src/m/model.safetensors"
cat "$work/src/m/model.safetensors" >/dev/null  # the source in the page cache: the daemon's path is measured

mount_ckptfs() {  # supervise=on|off
  mountpoint -q "$ck" && fusermount3 -u "$ck"
  build/ckptfs "$work/src" "$ck" -o "state=$work/state,settle=0,rescan=0,fill=off,supervise=$1" 2>/dev/null
  for _ in $(seq 1 600); do [ -L "$ck/by-name/m" ] && break; sleep 0.1; done
  [ -L "$ck/by-name/m" ] || { echo "ckptfs did not show the checkpoint" >&2; exit 1; }
  # Every chunk read and verified once, so that each run measures requests,
  # not a fresh daemon's first reads of the source.
  dd if="$(served)" of=/dev/null bs=4M iflag=direct status=none
}
iops() {  # FILE [DIRECT=1]: 4 KiB random reads, 4 jobs, $secs seconds
  fio --name=rr --filename="$1" --rw=randread --bs=4k --direct="${2:-1}" --invalidate=0 --ioengine=psync --numjobs=4 \
      --time_based --runtime="$secs" --group_reporting --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print(int(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))'
}
served() { echo "$ck/$(readlink "$ck/by-name/m" | sed 's|^\.\./||')/model.safetensors"; }

bindfs -o ro "$work/src" "$bf"
mount_ckptfs off  # builds the index once
printf '%-6s %12s %12s %8s %12s %12s\n' round "sup=off" "sup=on" "on/off" bindfs native
ratios=()
for r in $(seq 1 "$rounds"); do
  # Odd rounds measure off first, even ones on first: neither gains from going second.
  for mode in $([ $((r % 2)) = 1 ] && echo off on || echo on off); do
    mount_ckptfs $mode
    eval "$mode=\$(iops \"\$(served)\")"
  done
  b=$(iops "$bf/m/model.safetensors")
  n=$(iops "$work/src/m/model.safetensors" 0)
  ratio=$(awk -v a="$on" -v b="$off" 'BEGIN{printf "%.2f", a/b}')
  ratios+=("$ratio")
  printf '%-6s %12s %12s %8s %12s %12s\n' "$r" "$off" "$on" "$ratio" "$b" "$n"
done
echo "median on/off: $(printf '%s\n' "${ratios[@]}" | sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')" \
     "(rounds: ${ratios[*]})"
