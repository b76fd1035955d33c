#!/usr/bin/env bash
# One user's many readers against another user's one read (issue "Security
# and robustness": no user may stall another). Run by hand, as root, after
# the build:
#   tests/bench/bench_fair_share.sh [VERIFY=xxh3] [DAEMON=build/ckptfs]
#
# User 2101 reads six 256 MiB files of its own with twelve readers (six
# `cat`s dropping the page cache before each pass, six `dd iflag=direct`),
# while user 2102 `cat`s a 512 MiB file of root's (its page cache dropped
# first), three times. The same through a fresh mount (fill=off: every
# read goes through the daemon's chunk path; the source files stay in the
# page cache) and natively on the source files. Seconds; the ratio is
# 2102's read under the load over alone, for each.
set -euo pipefail
cd "$(dirname "$0")/../.."
verify=${1:-xxh3}
daemon=${2:-build/ckptfs}
[ -x "$daemon" ] || { echo "build first" >&2; exit 1; }
work=$(mktemp -d /var/tmp/ckptfs-bench-fair.XXXXXX)
src="$work/src" mnt="$work/mnt"
loops=""  # user 2101's reader loops, while they run
cleanup() {
  set +e
  rm -f "$work/go"
  [ -n "$loops" ] && kill $loops 2>/dev/null && wait $loops 2>/dev/null
  mountpoint -q "$mnt" && fusermount3 -u "$mnt"
  rm -rf "$work"
}
trap cleanup EXIT
chmod 755 "$work"
mkdir -p "$src/pub/big" "$src/u" "$mnt"
head -c 512M /dev/urandom >"$src/pub/big/model.bin"
for i in 1 2 3 4 5 6; do mkdir -p "$src/u/big$i"; head -c 256M /dev/urandom >"$src/u/big$i/model.bin"; done
chown -R 2101:2101 "$src/u"
cat "$src"/u/big*/model.bin "$src/pub/big/model.bin" >/dev/null
as() { local u=$1; shift; setpriv --reuid="$u" --regid="$u" --clear-groups "$@"; }
drop() { as "$1" /usr/bin/python3 -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED); os.close(fd)' "$2"; }
timed_cat() {  # FILE [KEEP_SOURCE_CACHED]
  drop 2102 "$1"
  [ -n "${2:-}" ] && cat "$2" >/dev/null
  local s e; s=$(date +%s.%N); as 2102 cat "$1" >/dev/null; e=$(date +%s.%N)
  awk -v a="$s" -v b="$e" 'BEGIN{printf "%.2f\n", b-a}'
}
best() { sort -g | head -1; }
worst() { sort -g | tail -1; }
run() {  # LABEL DIR_OF_U DIR_OF_PUB
  local label=$1 u=$2 pub=$3 alone loaded
  alone=$(for _ in 1 2 3; do timed_cat "$pub/model.bin" "$src/pub/big/model.bin"; done | best)
  touch "$work/go"
  for i in 1 2 3 4 5 6; do
    as 2101 bash -c "while [ -e '$work/go' ]; do /usr/bin/python3 -c 'import os,sys; fd=os.open(sys.argv[1],os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED); os.close(fd)' '$u/big$i/model.bin'; cat '$u/big$i/model.bin' >/dev/null; done" &
    loops+=" $!"
    as 2101 bash -c "while [ -e '$work/go' ]; do dd if='$u/big$i/model.bin' of=/dev/null bs=4M iflag=direct status=none; done" &
    loops+=" $!"
  done
  sleep 3
  loaded=$(for _ in 1 2 3; do timed_cat "$pub/model.bin" "$src/pub/big/model.bin"; done | worst)
  rm -f "$work/go"
  wait $loops
  loops=""
  printf '  %-28s %8s %12s %7s\n' "$label" "$alone" "$loaded" "$(awk -v a="$alone" -v b="$loaded" 'BEGIN{printf "%.1f", b/a}')"
}
"$daemon" "$src" "$mnt" -o "allow_other,state=$work/state,settle=0,rescan=0,verify=$verify,fill=off,fill_on_index=off,cache_size=256M"
shown=""
for _ in $(seq 1 600); do [ -L "$mnt/by-name/u/big6" ] && [ -L "$mnt/by-name/pub/big" ] && shown=1 && break; sleep 0.1; done
[ -n "$shown" ] || { echo "ckptfs did not show the checkpoints" >&2; exit 1; }
echo "user 2102's cat of 512 MiB (best alone, worst of 3 under user 2101's twelve readers; seconds)"
printf '  %-28s %8s %12s %7s\n' "" alone "under load" ratio
run "native" "$src/u" "$src/pub/big"
run "ckptfs, verify=$verify" "$mnt/by-name/u" "$mnt/by-name/pub/big"
