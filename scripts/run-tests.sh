#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds with warnings as errors,
# and runs every test through ctest; then builds the daemon and the suites
# again with ThreadSanitizer and runs the unit, security and main integration
# tests under it (scripts/run-tsan.sh). Needs root (apt-get, setpriv, and
# later FUSE mounts).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure --parallel "$(nproc)" --no-tests=error
CKPTFS_TSAN_NO_DEPS=1 scripts/run-tsan.sh
