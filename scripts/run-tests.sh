#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds with warnings as errors,
# and runs every test through ctest; meanwhile builds the daemon and the unit
# tests again with ThreadSanitizer and runs clang's thread-safety analysis
# over the sources (scripts/check-thread-safety.sh), and then runs the unit,
# security and main integration tests against the TSan build
# (scripts/run-tsan.sh). Needs root (apt-get, setpriv, and later FUSE
# mounts).
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
# The ThreadSanitizer build, at the lowest priority, while the suite runs:
# most tests wait on mounts, timers and the engines, and leave a core idle
# about a third of the time, which the build takes; the tests keep the CPU
# whenever they want it.
CKPTFS_TSAN_NO_DEPS=1 nice -n 19 scripts/run-tsan.sh --build-only >build/tsan-build.log 2>&1 &
tsan_build_pid=$!
# Clang's -Wthread-safety over every source, the same way (syntax only).
nice -n 19 scripts/check-thread-safety.sh >build/thread-safety.log 2>&1 &
tsa_pid=$!
trap 'kill "$venv_pid" "$tsan_build_pid" "$tsa_pid" 2>/dev/null || true' EXIT
ctest --test-dir build --output-on-failure --parallel "$(nproc)" --no-tests=error
wait "$venv_pid" || true  # done by now (engines.setup waited for it); its errors are engines.setup's
if ! wait "$tsan_build_pid"; then
  tail -n 60 build/tsan-build.log >&2
  echo "run-tests.sh: the ThreadSanitizer build failed (build/tsan-build.log)" >&2
  exit 1
fi
if ! wait "$tsa_pid"; then
  head -n 80 build/thread-safety.log >&2
  echo "run-tests.sh: clang's thread-safety analysis found problems (build/thread-safety.log)" >&2
  exit 1
fi
tail -n 1 build/thread-safety.log
CKPTFS_TSAN_NO_DEPS=1 scripts/run-tsan.sh
