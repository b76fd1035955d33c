#!/usr/bin/env bash
# Dark time of a checkpoint in motion (issue 20). Run by hand, as root, after
# scripts/build.sh:
#   tests/bench/bench_dark_time.sh [MIB=1024] [OTHER_CKPTFS]
#
# A MIB checkpoint (two shards and a config) is mounted (settle=1), then, in
# turn: `chmod -R a+r` over it (no mode changes, only ctimes), `chown -R` to
# its own owner, and one byte appended to its config. For each, a poller
# reads by-name/m every 2 ms from the change until the checkpoint is settled
# again, and prints how long by-name/m was absent (dark), how many polls saw
# it, and how long the re-verification took. With OTHER_CKPTFS (say, the
# daemon of an older build), the same runs for it too, side by side.
# The source's page cache is dropped before each change (fadvise DONTNEED
# of its files), so the re-verification reads the disk.
set -euo pipefail
cd "$(dirname "$0")/../.."
mib=${1:-1024}
other=${2:-}
[ -x build/ckptfs ] || { echo "build first: scripts/build.sh" >&2; exit 1; }

work=$(mktemp -d /tmp/ckptfs-bench-dark.XXXXXX)
cleanup() {
  mountpoint -q "$work/mnt" && fusermount3 -u "$work/mnt"
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/src/m" "$work/mnt"
half=$((mib / 2))
head -c "${half}M" /dev/urandom >"$work/src/m/model-00001-of-00002.safetensors"
head -c "${half}M" /dev/urandom >"$work/src/m/model-00002-of-00002.safetensors"
echo '{"architectures": ["Bench"]}' >"$work/src/m/config.json"

drop_source_cache() {
  python3 - "$work/src/m" <<'PY'
import os, sys
for name in os.listdir(sys.argv[1]):
    fd = os.open(os.path.join(sys.argv[1], name), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
}

# Polls by-name/m every 2 ms until status says m is exposed and not
# revalidating (and at least 0.5 s went by); prints dark ms, polls, seconds.
poll_until_settled() {
  python3 - "$work/mnt" "$work/src/m" "$ctl" <<'PY'
import json, os, subprocess, sys, time
mnt, src, ctl = sys.argv[1:]
start = time.monotonic(); dark = 0.0; polls = 0; last = start; seen_busy = False
def settled():
    out = subprocess.run([ctl, "status", "--json", mnt], capture_output=True, text=True).stdout
    for c in json.loads(out).get("checkpoints", []):
        if c.get("path") == src:
            busy = c.get("state") != "exposed" or c.get("revalidating", False)
            return not busy
    return False
next_status = start
while True:
    now = time.monotonic()
    present = os.path.lexists(os.path.join(mnt, "by-name", "m"))
    if not present:
        dark += now - last
    last = now; polls += 1
    if now >= next_status:
        next_status = now + 0.05
        if settled() and now - start > 0.5:
            break
    time.sleep(0.002)
print(f"{dark * 1000:.0f} {polls} {time.monotonic() - start:.2f}")
PY
}

run_one() {
  local daemon=$1 label=$2
  ctl=$(dirname "$daemon")/ckptfsctl
  [ -x "$ctl" ] || ctl=build/ckptfsctl
  rm -rf "$work/state"
  "$daemon" "$work/src" "$work/mnt" -o "state=$work/state,settle=1,rescan=0"
  for _ in $(seq 1 600); do [ -L "$work/mnt/by-name/m" ] && break; sleep 0.1; done
  for change in "chmod -R a+r" "chown -R same owner" "append to config.json"; do
    drop_source_cache
    case "$change" in
      chmod*) chmod -R a+r "$work/src/m" ;;
      chown*) chown -R "$(stat -c %u:%g "$work/src/m")" "$work/src/m" ;;
      append*) echo " " >>"$work/src/m/config.json" ;;
    esac
    read -r dark polls secs < <(poll_until_settled)
    printf '%-10s %-24s dark %6s ms   polls %6s   re-verified in %s s\n' "$label" "$change" "$dark" "$polls" "$secs"
  done
  fusermount3 -u "$work/mnt"
  sleep 0.5
}

echo "checkpoint: ${mib} MiB in two shards; settle=1" >&2
run_one "$PWD/build/ckptfs" "this"
[ -n "$other" ] && run_one "$(readlink -f "$other")" "other"
exit 0
