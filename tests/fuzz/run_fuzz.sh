#!/usr/bin/env bash
# Builds the safetensors header fuzzer with clang (libFuzzer, ASan, UBSan) and
# runs it for a bounded time over a copy of the committed corpus, so it can
# neither hang CI nor rewrite the corpus. Any crash, sanitizer report or
# broken invariant fails the run.
# Usage: run_fuzz.sh SOURCE_DIR WORK_DIR [SECONDS=20]
set -euo pipefail
src=$1
work=$2
secs=${3:-20}
command -v clang++ >/dev/null || { echo "run_fuzz.sh: clang++ is not installed (packaging/install-deps.sh installs it)" >&2; exit 1; }
mkdir -p "$work"
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -I"$src/include" "$src/tests/fuzz/safetensors_header_fuzzer.cpp" "$src/src/source/safetensors_header.cpp" \
  "$src/src/base/status.cpp" -o "$work/safetensors_header_fuzzer"
rm -rf "$work/corpus" "$work/artifacts"
cp -r "$src/tests/fuzz/corpus" "$work/corpus"
mkdir -p "$work/artifacts"
timeout $((secs + 120)) "$work/safetensors_header_fuzzer" -max_total_time="$secs" -timeout=10 -max_len=65536 \
  -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus"
