#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds with warnings as errors,
# and runs every test through ctest; then builds the daemon and the unit
# tests again with ThreadSanitizer and runs the unit, security and main
# integration tests against it (scripts/run-tsan.sh). Needs root (apt-get,
# setpriv, and later FUSE mounts).
#
# The engines tests' virtual environment (tests/engines/make_venv.sh: vLLM
# and the loaders from PyPI, minutes of download) is made while the C++
# build runs, and the other tests meanwhile; ctest's engines.setup waits
# for it (a lock), and runs it again if it failed, so that its error is in
# the test log.
set -euo pipefail
cd "$(dirname "$0")/.."
packaging/install-deps.sh
mkdir -p build
tests/engines/make_venv.sh build >build/make_venv.log 2>&1 &
venv_pid=$!
# Line tables are enough for the backtraces of a failing test, and full
# debug information costs a quarter of the build.
scripts/build.sh -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
ctest --test-dir build --output-on-failure --parallel "$(nproc)" --no-tests=error
wait "$venv_pid" || true  # done by now (engines.setup waited for it); its errors are engines.setup's
CKPTFS_TSAN_NO_DEPS=1 scripts/run-tsan.sh
