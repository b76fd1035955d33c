#!/usr/bin/env bash
# Runs the safetensors header fuzzer (the CMake target
# safetensors_header_fuzzer: clang, libFuzzer, ASan, UBSan) for a bounded time
# over a copy of the committed corpus, so it can neither hang CI nor rewrite
# the corpus. Any crash, sanitizer report or broken invariant fails the run.
# Usage: run_fuzz.sh FUZZER CORPUS_DIR WORK_DIR [SECONDS=20]
set -euo pipefail
fuzzer=$1
corpus=$2
work=$3
secs=${4:-20}
[ -x "$fuzzer" ] || { echo "run_fuzz.sh: $fuzzer is missing: cmake --build build --target safetensors_header_fuzzer" >&2; exit 1; }
mkdir -p "$work"
rm -rf "$work/corpus" "$work/artifacts"
cp -r "$corpus" "$work/corpus"
mkdir -p "$work/artifacts"
timeout $((secs + 120)) "$fuzzer" -max_total_time="$secs" -timeout=10 -max_len=65536 \
  -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus"
