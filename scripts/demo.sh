#!/usr/bin/env bash
# The quick-start demo: builds ckptfs, writes a small demo tree (a base model,
# a fine-tune with the same file names and safetensors headers that differs in
# one tensor, an identical copy of the base, and a trainer run with nested
# step checkpoints), and prints every checkpoint's digest name.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null

work=$(mktemp -d /tmp/ckptfs-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
build/tests/ckptfs-make-demo-tree "$work/src"
shard=model-00002-of-00002.safetensors
header_bytes() { head -c "$((8 + $(od -An -tu8 -N8 "$1")))" "$1" | sha256sum | cut -c1-16; }

echo "== demo tree: $work/src"
(cd "$work/src" && find . -mindepth 1 -name '.*' -prune -o -type f -print | LC_ALL=C sort | sed 's/^/   /')
echo
echo "== base and finetune share file names and safetensors headers:"
echo "   header of base/$shard:     sha256 $(header_bytes "$work/src/base/$shard")..."
echo "   header of finetune/$shard: sha256 $(header_bytes "$work/src/finetune/$shard")..."
echo "   but their bytes differ:    $(cmp "$work/src/base/$shard" "$work/src/finetune/$shard" | sed "s|$work/src/||g")"
echo
echo "== ckptfsctl digest $work/src"
build/ckptfsctl --state "$work/state" digest "$work/src" | sed "s|$work/src/||"
echo
echo "base and base-copy share one name; finetune gets its own; each step checkpoint of run7 is separate."
