#!/usr/bin/env bash
# The quick-start demo: builds ckptfs, writes a small demo tree (a base model,
# a fine-tune with the same file names and safetensors headers that differs in
# one tensor, an identical copy of the base, and a trainer run with nested
# step checkpoints), mounts it under a temporary directory, shows the view,
# reads one tensor through both digest paths, and unmounts.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null

work=$(mktemp -d /tmp/ckptfs-demo.XXXXXX)
models="$work/models"
cleanup() {
  if mountpoint -q "$models"; then fusermount3 -u "$models"; fi
  rm -rf "$work"
}
trap cleanup EXIT
build/tests/ckptfs-make-demo-tree "$work/src"
mkdir -p "$models"

echo "== source tree: $work/src"
(cd "$work/src" && find . -mindepth 1 -name '.*' -prune -o -type d -print | LC_ALL=C sort | sed 's/^/   /')
echo
echo "== ckptfs $work/src $models -o state=$work/state,settle=0"
build/ckptfs "$work/src" "$models" -o "state=$work/state,settle=0"
for _ in $(seq 1 100); do [ -L "$models/by-name/run7/checkpoint-500" ] && break; sleep 0.1; done
echo
echo "== ls -l $models"
ls -l "$models" | sed 's/^/   /'
echo
echo "== ls -l $models/by-name $models/by-name/run7"
ls -l "$models/by-name" "$models/by-name/run7" | sed "s|$models|/models|g; s/^/   /"
echo
echo "== one tensor (layers.4.weight) read through each digest path"
python3 - "$models" <<'PY'
import hashlib, json, os, struct, sys
models = sys.argv[1]
for name in ("base", "finetune"):
    digest_dir = os.path.realpath(os.path.join(models, "by-name", name))
    path = os.path.join(digest_dir, "model-00002-of-00002.safetensors")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = f.read(n)
        meta = json.loads(header)["layers.4.weight"]
        begin, end = meta["data_offsets"]
        f.seek(8 + n + begin)
        data = f.read(end - begin)
    print(f"   {name:9s} -> {os.path.basename(digest_dir)[:23]}...  header sha256 "
          f"{hashlib.sha256(header).hexdigest()[:12]}  tensor sha256 {hashlib.sha256(data).hexdigest()[:12]}"
          f"  first values {', '.join(f'{v:.3g}' for v in struct.unpack('<3f', data[:12]))}")
PY
echo
echo "Same file names and headers, different bytes, different paths: base and base-copy share one"
echo "digest directory, finetune has its own, and every step checkpoint of run7 is separate."
echo
echo "== ckptfsctl status $models"
build/ckptfsctl status "$models" | sed 's/^/   /'
