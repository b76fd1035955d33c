#!/usr/bin/env bash
# Benchmark of a checkpoint's arrival (issue 20, "index and fill in one pass"):
# from the rename of a new checkpoint into SRC (its bytes not in the page
# cache, settle=0) to the last tensor loaded through the mount
# (tests/bench/load_safetensors.py: mmap, then a copy of each tensor), against
# a native load of the same bytes with their page cache dropped, in the same
# run. Run by hand, as root, after a build:
#   tests/bench/bench_arrival.sh [ROUNDS=3]
# A subset: LAYOUTS="qwen big", FILLS="free off", PAGES="fresh recycled"
# (the defaults: every row). DAEMONS="build/ckptfs /tmp/ckptfs-old" runs
# every row once per daemon binary, side by side in the same run (to
# measure a change against the one before it); RESERVES="auto off" every
# row once per page_reserve= value (the default: auto only).
# Cases: a 1.5 GB checkpoint of two shards (Qwen3-0.6B layout, bf16) and a
# 6 GB checkpoint of one shard; each with fill_on_index=free (the default:
# the indexer fills the host tier from the bytes it hashes) and =off (the
# first open copies the files again, as before).
#
# The VMs these run on are slow the first time they touch memory freed a
# while before (free page reporting hands it back to the host; fresh 2 MiB
# pages then cost about 20x). Each case is timed both ways, and says which;
# the native load of the row is timed the same way as the arrival:
#   fresh     10 s after the last memory was freed (it has been reported):
#             the copies, the page cache and the loader's tensors all land
#             in fresh memory
#   recycled  right before the rename (or the native load), as much memory
#             as the copies need is touched and freed again, so they land
#             in pages the guest kept
# Every new checkpoint has new bytes (so nothing is known to the index or
# the host tier), and the copies of each round are evicted after it. Each
# row mounts anew; "first" is its first round (the daemon's first copies);
# "digest" is the best time from the rename to the digest's appearance.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
layouts=${LAYOUTS:-qwen big}
fills=${FILLS:-free off}
pagesets=${PAGES:-fresh recycled}
daemons=${DAEMONS:-build/ckptfs}
reserves=${RESERVES:-auto}
[ -x build/ckptfs ] && [ -x build/ckptfsctl ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
for d in $daemons; do [ -x "$d" ] || { echo "no daemon at $d" >&2; exit 1; }; done

work=$(mktemp -d /var/tmp/ckptfs-bench-arrival.XXXXXX)
ck="$work/mnt"
cleanup() {
  mountpoint -q "$ck" && fusermount3 -u "$ck"
  rm -rf "$work" /dev/shm/ckptfs-bench-recycle
}
trap cleanup EXIT
mkdir -p "$work/src/ready" "$ck"
echo w >"$work/src/ready/model.bin"

# write_checkpoint DIR LAYOUT SEED: a new checkpoint of random bytes.
write_checkpoint() { python3 tests/bench/make_checkpoint.py "$1" "$2" "$3"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f\n", b-a}'; }
drop() { python3 -c 'import os,sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"; }
load() { python3 tests/bench/load_safetensors.py "$1" | cut -d' ' -f1; }
# Memory the copies need, touched and freed just before: pages the guest kept.
recycle() {
  head -c "$(numfmt --from=iec "$1")" /dev/zero >/dev/shm/ckptfs-bench-recycle
  rm -f /dev/shm/ckptfs-bench-recycle
}
# A 5 ms wait with no process started: a `sleep` forked every 5 ms while
# the digest is awaited took CPU from the daemon being timed, on 2 CPUs.
exec {pause_fd}<> <(:)
pause() { read -rt 0.005 -u "$pause_fd" || true; }
# The native load and the arrival each start on the same kind of memory.
pages_as() { if [ "$1" = fresh ]; then sleep 10; else recycle "$2"; fi; }
mount_ckptfs() {
  mountpoint -q "$ck" && fusermount3 -u "$ck"
  "$daemon" "$work/src" "$ck" -o "state=$work/state,settle=0,rescan=0,cache_size=10G,supervise=off,$1"
  for _ in $(seq 1 600); do [ -L "$ck/by-name/ready" ] && return; sleep 0.1; done
  echo "ckptfs did not start" >&2; exit 1
}
min() { sort -g | head -1; }
row() { printf '  %-44s %9s %9s %9s %9s %7s %7s\n' "$@"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
seed=0

echo "$(nproc) CPUs; passthrough and host tier figures, seconds, best of $rounds"
for layout in $layouts; do
  size=$([ $layout = big ] && echo 6.3G || echo 1.5G)
  label=$([ $layout = big ] && echo "6 GB, one shard" || echo "1.5 GB, two shards")
  echo
  echo "$label: rename -> last tensor loaded through the mount, vs native load (page cache dropped)"
  row "case" "digest" "arrival" "first" "native" "ratio" "first"
  for fill in $fills; do
    for pages in $pagesets; do
     for daemon in $daemons; do
     for reserve in $reserves; do
      # A mount per row: its first round keeps no memory yet (and its page
      # reserve, where it keeps one, may still be growing).
      mount_ckptfs "fill_on_index=$fill,page_reserve=$reserve"
      best= nbest= first= vbest=
      for _ in $(seq 1 "$rounds"); do
        seed=$((seed + 1))
        stage="$work/src/.stage-$seed"  # hidden: not walked until renamed
        write_checkpoint "$stage" $layout $seed
        drop "$stage"/*
        pages_as "$pages" "$size"
        n=$(load "$stage"); drop "$stage"/*
        nbest=$(printf '%s\n%s\n' "$n" "$nbest" | grep . | min)
        pages_as "$pages" "$size"
        t0=$(now)
        mv "$stage" "$work/src/step-$seed"
        until [ -L "$ck/by-name/step-$seed" ]; do pause; done
        v=$(secs "$t0" "$(now)")
        vbest=$(printf '%s\n%s\n' "$v" "$vbest" | grep . | min)
        dir="$ck/$(readlink "$ck/by-name/step-$seed" | sed 's|^\.\./||')"
        load "$dir" >/dev/null
        t=$(secs "$t0" "$(now)")
        best=$(printf '%s\n%s\n' "$t" "$best" | grep . | min)
        [ -n "$first" ] || first=$t
        build/ckptfsctl evict "$ck/by-name/step-$seed" >/dev/null  # room for the next round
        rm -rf "$work/src/step-$seed"
      done
      name="fill_on_index=$fill, $pages pages"
      [ "$daemons" = build/ckptfs ] || name="$name, $(basename "$daemon")"
      [ "$reserves" = auto ] || name="$name, reserve $reserve"
      row "$name" "$vbest" "$best" "$first" "$nbest" "$(ratio "$best" "$nbest")" "$(ratio "$first" "$nbest")"
     done
     done
    done
  done
done
