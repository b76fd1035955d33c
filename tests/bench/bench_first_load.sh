#!/usr/bin/env bash
# First loads by real parallel loaders on a fresh mount (issue 20 item 5).
# Run by hand, as root, after the build (build/ckptfs):
#   tests/bench/bench_first_load.sh [RUNS=3]
#
# A 2.7 GB, 3-shard bf16 Llama-layout checkpoint (28 layers, hidden 2048,
# with config.json and model.safetensors.index.json, so that transformers
# can build the model) is loaded, in one run of the script, by
#   - runai-model-streamer (SafetensorsStreamer over the three shards at
#     once: its threads, O_DIRECT),
#   - fastsafetensors (SafeTensorsFileLoader, nogds=True, to the CPU),
#   - transformers (AutoModelForCausalLM.from_pretrained, bf16, CPU),
# each from the source directory itself ("native") and through a fresh
# ckptfs mount of it (the index already built, as after a reboot), both
# after `echo 3 > /proc/sys/vm/drop_caches`; and `fio` reads the same three
# files with O_DIRECT, 4 MiB, at the depth of runai's reads, for the disk's
# rate. Each figure is the best of RUNS; the ratio is ckptfs over native.
#
# Twice: with this VM's free page reporting as it is (memory freed by the
# cache drop is handed back to the host, so each first touch of a page
# faults on the host: "cold pages"), and with it off for the run
# (page_reporting_order raised past the largest order, after memory was
# touched once, so that freed pages stay backed: "warm pages"); the setting
# is put back at the end. The loaders come from PyPI, in a venv under
# build/bench-venv (made on first use), or VENV= (the engines tests' venv,
# build/venv-engines, has them all).
# A subset: LOADERS="runai fastsafetensors transformers", PAGES="cold warm".
# DAEMONS="build/ckptfs /tmp/ckptfs-old" measures each daemon binary in
# turn in the same run, a column each (a change against the one before it).
# OPTIONS="- fill=off" adds a column per set of mount options for each
# daemon ("-": the defaults; several options joined by commas).
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-3}
[ -x build/ckptfs ] || { echo "build first" >&2; exit 1; }
command -v fio >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fio >/dev/null
venv=${VENV:-build/bench-venv}
daemons=${DAEMONS:-build/ckptfs}
for d in $daemons; do [ -x "$d" ] || { echo "no daemon at $d" >&2; exit 1; }; done
daemon=${daemons%% *}
if [ ! -x $venv/bin/python ] || ! $venv/bin/python -c 'import runai_model_streamer, fastsafetensors, transformers' 2>/dev/null; then
  python3 -m venv $venv
  $venv/bin/pip install -q torch runai-model-streamer fastsafetensors transformers safetensors numpy
fi
py=$venv/bin/python

work=$(mktemp -d /var/tmp/ckptfs-bench-first.XXXXXX)
ck="$work/mnt"
reporting=/sys/module/page_reporting/parameters/page_reporting_order
reporting_was=$(cat $reporting 2>/dev/null || echo "")
cleanup() {
  mountpoint -q "$ck" && fusermount3 -u "$ck"
  [ -n "$reporting_was" ] && echo "$reporting_was" >$reporting
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/src" "$ck"
echo "writing a 2.7 GB 3-shard checkpoint ..." >&2
$py - "$work/src/llama" <<'PY'
import json, os, struct, sys
d, layers, mlp, vocab, kv = 2048, 28, 5632, 32000, 256
tensors = [("model.embed_tokens.weight", [vocab, d])]
for i in range(layers):
    p = f"model.layers.{i}."
    tensors += [(p + "self_attn.q_proj.weight", [d, d]), (p + "self_attn.k_proj.weight", [kv, d]),
                (p + "self_attn.v_proj.weight", [kv, d]), (p + "self_attn.o_proj.weight", [d, d]),
                (p + "mlp.gate_proj.weight", [mlp, d]), (p + "mlp.up_proj.weight", [mlp, d]),
                (p + "mlp.down_proj.weight", [d, mlp]), (p + "input_layernorm.weight", [d]),
                (p + "post_attention_layernorm.weight", [d])]
tensors += [("model.norm.weight", [d]), ("lm_head.weight", [vocab, d])]
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
n = 3
per = (len(tensors) + n - 1) // n
weight_map = {}
for s in range(n):
    part, header, off = tensors[s * per:(s + 1) * per], {}, 0
    name = f"model-{s + 1:05d}-of-{n:05d}.safetensors"
    for t, shape in part:
        size = 2
        for x in shape: size *= x
        header[t] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + size]}
        weight_map[t] = name
        off += size
    h = json.dumps(header).encode(); h += b" " * (-len(h) % 8)
    with open(os.path.join(out, name), "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h)
        # Random bf16 with the exponent kept small, so that the values are finite.
        block = bytearray(os.urandom(1 << 24))
        block[1::2] = bytes(b & 0xBF for b in block[1::2])
        for _ in range(off >> 24): f.write(block)
        f.write(block[:off & ((1 << 24) - 1)])
json.dump({"metadata": {}, "weight_map": weight_map}, open(os.path.join(out, "model.safetensors.index.json"), "w"))
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d, "intermediate_size": mlp,
           "num_hidden_layers": layers, "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": vocab,
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "hidden_act": "silu", "rope_theta": 10000.0},
          open(os.path.join(out, "config.json"), "w"))
PY
src="$work/src/llama"

# The loaders, each printing its seconds.
cat >"$work/load.py" <<'PY'
import glob, os, sys, time
kind, d = sys.argv[1], sys.argv[2]
files = sorted(glob.glob(os.path.join(d, "*.safetensors")))
start = time.monotonic()
if kind == "runai":
    from runai_model_streamer import SafetensorsStreamer
    with SafetensorsStreamer() as s:
        s.stream_files(files)
        n = sum(t.numel() for _, t in s.get_tensors())
elif kind == "fastsafetensors":
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup
    loader = SafeTensorsFileLoader(SingleGroup(), "cpu", nogds=True)
    loader.add_filenames({0: files})
    fb = loader.copy_files_to_device()
    n = sum(fb.get_tensor(k).numel() for k in loader.get_keys())
    fb.close(); loader.close()
else:
    import torch
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    n = sum(p.numel() for p in m.parameters())
print(f"{time.monotonic() - start:.4f} {n}")
PY

now() { date +%s.%N; }
min_of() { sort -g | head -1; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
mount_ckptfs() {
  mountpoint -q "$ck" && fusermount3 -u "$ck"
  local extra=""; [ -n "$1" ] && [ "$1" != - ] && extra=",$1"
  "$daemon" "$work/src" "$ck" -o "state=$work/state,settle=0,rescan=0,cache_size=8G$extra"
  for _ in $(seq 1 1200); do [ -L "$ck/by-name/llama" ] && return; sleep 0.1; done
  echo "ckptfs did not show the checkpoint" >&2; exit 1
}
digest_dir() { echo "$ck/$(readlink "$ck/by-name/llama" | sed 's|^\.\./||')"; }
load() { TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1 RUNAI_STREAMER_CONCURRENCY=16 $py "$work/load.py" "$1" "$2" | cut -d' ' -f1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
fio_rate() {
  local files; files=$(ls "$src"/*.safetensors | paste -sd:)
  fio --name=shards --filename="$files" --rw=read --bs=4m --iodepth=16 --ioengine=io_uring --direct=1 \
      --size=100% --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"] / 1e9)'
}
# Memory touched once and freed, so that the loads below find backed pages.
touch_memory() { $py -c 'import mmap; m = mmap.mmap(-1, 8 << 30); [m.__setitem__(slice(i, i + 1), b"x") for i in range(0, 8 << 30, 4096)]'; }
# Cold: 10 s after the drop, by when its freed memory has been reported
# (the native and the ckptfs load alike); warm: memory touched again.
settle_pages() { if [ "$1" = warm ]; then touch_memory; else sleep 10; fi; }

mount_ckptfs ""  # index it once
fusermount3 -u "$ck"
bytes=$(cat "$src"/*.safetensors | wc -c)
for pages in ${PAGES:-cold warm}; do
  if [ $pages = warm ]; then
    [ -w $reporting ] || { echo "no $reporting: warm-page runs skipped" >&2; break; }
    echo 11 >$reporting  # past the largest order: nothing is reported
    touch_memory
  fi
  echo
  echo "first load, fresh mount, page caches dropped, $pages pages (seconds, best of $runs; ratio = ckptfs / native)"
  header=$(printf '  %-34s %9s' loader native)
  for daemon in $daemons; do for opts in ${OPTIONS:--}; do
    header+=$(printf ' %9s %7s' "$(basename "$daemon" | cut -c1-9)" ratio)
    [ "$opts" != - ] && header+=" ($opts)"
  done; done
  echo "$header"
  best=$(for _ in $(seq $runs); do drop; fio_rate; done | sort -g | tail -1)
  printf '  %-34s %9s\n' "fio, 3 files, O_DIRECT, 4M, depth 16" "$(awk -v g="$best" -v b="$bytes" 'BEGIN{printf "%.2fs %.2fGB/s", b/1e9/g, g}')"
  for kind in ${LOADERS:-runai fastsafetensors transformers}; do
    n=$(for _ in $(seq $runs); do drop; settle_pages $pages; load $kind "$src"; done | min_of)
    line=$(printf '  %-34s %9s' "$kind" "$n")
    for daemon in $daemons; do for opts in ${OPTIONS:--}; do
      c=$(for _ in $(seq $runs); do
            mountpoint -q "$ck" && fusermount3 -u "$ck"
            drop
            mount_ckptfs "$opts"
            settle_pages $pages
            load $kind "$(digest_dir)"
          done | min_of)
      line+=$(printf ' %9s %7s' "$c" "$(ratio "$c" "$n")")
    done; done
    echo "$line"
  done
  echo "  (last mount's fills: $(build/ckptfsctl stats --json "$ck" | python3 -c 'import json,sys; f=json.load(sys.stdin)["fills"]; print(f["completed"], "fills,", round(f["bytes_per_second"]/1e9, 2), "GB/s each on average,", f.get("streamed_reads"), "reads streamed,", f.get("header_scan_opens"), "header-scan opens")'))"
done
