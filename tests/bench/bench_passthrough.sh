#!/usr/bin/env bash
# Benchmark of kernel passthrough to the host tier (issue 12). Run by hand, as
# root, after scripts/build.sh:
#   tests/bench/bench_passthrough.sh [BIG_MIB=2048]
#
# In one run, every figure as a ratio to the native file on the same machine:
#   1. a BIG_MIB file resident in ckptfs (preloaded: passthrough to a sealed
#      memfd) vs native page cache: buffered read (dd bs=1M) and mmap touch of
#      every page;
#   2. loading every tensor of a Qwen3-0.6B-layout checkpoint (2 shards,
#      1.5 GB, bf16; tests/bench/load_safetensors.py: mmap, then a copy of
#      each tensor) after `ckptfsctl preload`, vs native, bindfs and
#      squashfuse (all with their sources in the page cache);
#      (and, once, with 4 KiB pages in the memfds: shmem_huge=keep under the
#      kernel's default policy);
#   3. the first load through a fresh mount (index already built, the node
#      "just booted") with the source's page cache dropped, and with it warm,
#      for fill=wait (the default: the first open waits for the copy) and
#      fill=open (the first open is served by the chunk path while the file
#      is copied), and the load after it; vs native with its page cache
#      dropped / warm;
#   4. fill rate from a cold source (ckptfsctl preload, fill_depth=D,
#      fill_io=buffered|direct|auto) vs fio sequential read of the same file, same
#      block size (4 MiB, the chunk size), depth D (io_uring) and O_DIRECT
#      or not, for D in 1 2 4.
# Page caches are dropped per file (fadvise DONTNEED), never machine-wide.
# Best of 3 for every figure. Needs about 4 * BIG_MIB + 6 GB of free memory.
set -euo pipefail
cd "$(dirname "$0")/../.."
big_mib=${1:-2048}
[ -x build/ckptfs ] && [ -x build/tests/ckptfs-bench-mmap ] || { echo "build first: scripts/build.sh" >&2; exit 1; }
need=()
for t in bindfs squashfuse mksquashfs fio; do command -v $t >/dev/null || need+=($t); done
if [ ${#need[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bindfs squashfuse squashfs-tools fio >/dev/null
fi

work=$(mktemp -d /tmp/ckptfs-bench-pt.XXXXXX)
ck="$work/ckptfs"
mounts=("$ck" "$work/bindfs" "$work/squashfuse")
# The daemon sets the kernel's shmem huge-page policy to advise when it is
# still the default (shmem_huge=advise); case 2 also measures 4 KiB pages.
# Whatever it was is put back at the end.
thp=/sys/kernel/mm/transparent_hugepage/shmem_enabled
thp_was=$(sed -n 's/.*\[\(.*\)\].*/\1/p' "$thp")
cleanup() {
  for m in "${mounts[@]}"; do mountpoint -q "$m" && fusermount3 -u "$m"; done
  echo "$thp_was" >"$thp"
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/src/big" "${mounts[@]}"
echo "writing a ${big_mib} MiB file and a 1.5 GB Qwen3-0.6B-layout checkpoint ..." >&2
head -c "${big_mib}M" /dev/urandom >"$work/src/big/model.safetensors"
python3 tests/bench/make_checkpoint.py "$work/src/qwen" qwen
mksquashfs "$work/src/qwen" "$work/qwen.sqfs" -noappend -quiet >/dev/null
big="$work/src/big/model.safetensors"
qwen="$work/src/qwen"

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.4f\n", b-a}'; }
min3() { sort -g | head -1; }
# Drops the page cache of FILE... (not the machine's).
drop() { python3 -c 'import os,sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"; }
warm() { cat "$@" >/dev/null; }
time_read() { local t0; t0=$(now); dd if="$1" of=/dev/null bs=1M status=none; secs "$t0" "$(now)"; }
time_mmap() { build/tests/ckptfs-bench-mmap "$1"; }
time_load() { python3 tests/bench/load_safetensors.py "$1" | cut -d' ' -f1; }
mount_ckptfs() {  # OPTIONS: a fresh daemon (the index in $work/state is kept across mounts)
  mountpoint -q "$ck" && fusermount3 -u "$ck"
  build/ckptfs "$work/src" "$ck" -o "state=$work/state,settle=0,rescan=0,cache_size=8G,$1"
  for _ in $(seq 1 1200); do [ -L "$ck/by-name/qwen" ] && [ -L "$ck/by-name/big" ] && return; sleep 0.1; done
  echo "ckptfs did not show the checkpoints" >&2; exit 1
}
digest_dir() { echo "$ck/$(readlink "$ck/by-name/$1" | sed 's|^\.\./||')"; }
ratio() { awk -v n="$1" -v c="$2" 'BEGIN{printf "%.2f", n/c}'; }
row() { printf '  %-58s %8s %8s %7s\n' "$@"; }

warm "$big" "$qwen"/*.safetensors "$work/qwen.sqfs"
mount_ckptfs "fill=open"
echo "passthrough: $(build/ckptfsctl status "$ck" | sed -n 's/^passthrough *//p')"

# 1. The big file, resident.
build/ckptfsctl preload "$ck/by-name/big" >/dev/null
ckbig="$(digest_dir big)/model.safetensors"
echo
echo "1. ${big_mib} MiB file, page cache / host tier warm (seconds, best of 3; ratio = throughput vs native)"
row case native ckptfs ratio
for kind in read mmap; do
  n=$(for _ in 1 2 3; do time_$kind "$big"; done | min3)
  c=$(for _ in 1 2 3; do time_$kind "$ckbig"; done | min3)
  row "$kind, resident (passthrough)" "$n" "$c" "$(ratio "$n" "$c")"
done
reads=$(build/ckptfsctl stats --json "$ck" | python3 -c 'import json,sys; print(json.load(sys.stdin)["read_requests"])')
echo "  (read requests that reached the daemon: $reads)"

# 2. The checkpoint after preload, and through bindfs and squashfuse.
build/ckptfsctl preload "$ck/by-name/qwen" >/dev/null
bindfs -o ro "$work/src" "$work/bindfs"
squashfuse "$work/qwen.sqfs" "$work/squashfuse"
echo
echo "2. loading every tensor of the 1.5 GB checkpoint, sources warm (seconds, best of 3; ratio = time vs native)"
row case seconds ratio ""
native_warm=$(for _ in 1 2 3; do time_load "$qwen"; done | min3)
row "native (page cache)" "$native_warm" "1.00" ""
for c in "ckptfs after preload (passthrough):$(digest_dir qwen)" "bindfs -o ro:$work/bindfs/qwen" \
         "squashfuse:$work/squashfuse"; do
  t=$(for _ in 1 2 3; do time_load "${c#*:}"; done | min3)
  row "${c%%:*}" "$t" "$(ratio "$t" "$native_warm")" ""
done
fusermount3 -u "$work/bindfs"
fusermount3 -u "$work/squashfuse"
# The same with the kernel's default policy (4 KiB pages in the memfds).
echo never >"$thp"
mount_ckptfs "fill=open,shmem_huge=keep"
build/ckptfsctl preload "$ck/by-name/qwen" >/dev/null
t=$(for _ in 1 2 3; do time_load "$(digest_dir qwen)"; done | min3)
row "ckptfs after preload, 4 KiB pages (shmem_huge=keep)" "$t" "$(ratio "$t" "$native_warm")" ""
echo advise >"$thp"

# 3. The first load through a fresh mount.
echo
echo "3. first load through a fresh mount (seconds, best of 3; ratio = time vs native in the same state)"
row case first next ratio
native_cold=$(for _ in 1 2 3; do drop "$qwen"/*; time_load "$qwen"; done | min3)
row "native, page cache dropped" "$native_cold" "" "1.00"
row "native, page cache warm" "$native_warm" "" "1.00"
for policy in wait open; do
  for state in cold warm; do
    best_first= best_next=
    for _ in 1 2 3; do
      mountpoint -q "$ck" && fusermount3 -u "$ck"
      if [ $state = cold ]; then drop "$qwen"/*; else warm "$qwen"/*; fi
      mount_ckptfs "fill=$policy"
      dir=$(digest_dir qwen)
      f=$(time_load "$dir")
      # fill=open: the next load waits for nothing, but the copies of the two
      # shards must be there for it to pass through; give the background
      # fill its time.
      for _ in $(seq 1 600); do
        [ "$(build/ckptfsctl stats --json "$ck" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tiers"]["host"]["files"])')" -ge 2 ] && break
        sleep 0.1
      done
      x=$(time_load "$dir")
      best_first=$(printf '%s\n%s\n' "$f" "$best_first" | grep . | min3)
      best_next=$(printf '%s\n%s\n' "$x" "$best_next" | grep . | min3)
    done
    ref=$native_warm; [ $state = cold ] && ref=$native_cold
    row "ckptfs fill=$policy, source page cache $([ $state = cold ] && echo dropped || echo warm)" \
        "$best_first" "$best_next" "$(ratio "$best_first" "$ref")"
  done
done

# 4. Fill rate from a cold source vs fio at the same depth and block size,
# buffered (fio --direct=0, fill_io=buffered), direct (--direct=1,
# fill_io=direct) and auto (fill_io=auto, which reads the chunks of a cold
# source directly, against fio --direct=0).
echo
echo "4. filling the ${big_mib} MiB file from a cold source vs fio (MB/s, best of 3; 4 MiB reads)"
row "io, depth" "fio" ckptfs ratio
size=$(stat -c %s "$big")
for io in buffered direct auto; do
  for depth in 1 2 4; do
    f=$(for _ in 1 2 3; do
          drop "$big"
          fio --name=seq --filename="$big" --rw=read --bs=4m --iodepth=$depth --ioengine=io_uring \
              --direct=$([ $io = direct ] && echo 1 || echo 0) --invalidate=1 --size="$size" --output-format=json 2>/dev/null |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"] / 1e6)'
        done | sort -g | tail -1)
    mount_ckptfs "fill=preload,fill_depth=$depth,fill_io=$io"
    c=$(for _ in 1 2 3; do
          build/ckptfsctl evict "$ck/by-name/big" >/dev/null
          drop "$big"
          t0=$(now); build/ckptfsctl preload "$ck/by-name/big" >/dev/null; t=$(secs "$t0" "$(now)")
          awk -v s="$size" -v t="$t" 'BEGIN{print s/t/1e6}'
        done | sort -g | tail -1)
    row "$io, $depth" "$(printf %.0f "$f")" "$(printf %.0f "$c")" "$(ratio "$c" "$f")"
  done
done
