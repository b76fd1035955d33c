#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds with warnings as errors,
# and runs every test through ctest. Needs root (apt-get, setpriv, and later
# FUSE mounts).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure --parallel "$(nproc)" --no-tests=error
