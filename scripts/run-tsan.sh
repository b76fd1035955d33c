#!/usr/bin/env bash
# ThreadSanitizer build of the daemon and the test suites, part of the CI test
# command (scripts/run-tests.sh runs it after the normal suite). Builds into
# ./build-tsan and runs the unit tests, the security suite and the
# integration tests that drive the daemon hardest (mounts, caches,
# passthrough, teardown); the daemons' own reports go to
# /tmp/ckptfs-tsan.PID. Exits non-zero on any test failure or report.
# CKPTFS_TSAN_NO_DEPS=1 skips packaging/install-deps.sh (run-tests.sh has
# just run it).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${CKPTFS_TSAN_NO_DEPS:-0}" != 1 ]]; then packaging/install-deps.sh; fi
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPTFS_WITH_CUDA=OFF -DCKPTFS_FUZZ=OFF \
  -DCKPTFS_HARDENING=OFF -DCMAKE_CXX_FLAGS="-fsanitize=thread -O1" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" >/dev/null
cmake --build build-tsan --parallel "$(nproc)" --target ckptfs ckptfsctl ckptfs_unit_tests ckptfs_integration_tests \
  ckptfs_security_tests ckptfs-make-demo-tree ckptfs-test-faultyfs ckptfs-test-compare-tree
rm -f /tmp/ckptfs-tsan.*
export TSAN_OPTIONS="halt_on_error=0 report_signal_unsafe=0 log_path=/tmp/ckptfs-tsan"
# Left out, to keep CI well under its 30 minutes on 2 cores (TSan runs code
# 5 to 15 times slower): single-threaded scale tests of the header parser
# (2 minutes and more under TSan, nothing shared), the 2,000-checkpoint mount
# and the open/close count test (scale, not concurrency); and
# RefusedPinningGoesOnUnpinned, because under TSan the runtime's own mappings
# change what mlock reports.
build-tsan/tests/ckptfs_unit_tests \
  --gtest_filter='-SafetensorsHeaderTest.HundredsOfThousandsOfTensorsParseAndStamp:SafetensorsHeaderTest.ManyMetadataKeysParseAndStamp:SafetensorsHeaderTest.HeaderSizeLimit'
build-tsan/tests/ckptfs_security_tests
build-tsan/tests/ckptfs_integration_tests \
  --gtest_filter='MountTest.*:CacheMountTest.*:Passthrough*:TeardownTest.*:-CacheMountTest.RefusedPinningGoesOnUnpinned:MountTest.ThousandsOfCheckpoints:PassthroughMountTest.OpensAndClosesDoNotAccumulateBackingIdsOrInodes'
if ls /tmp/ckptfs-tsan.* >/dev/null 2>&1; then
  echo "run-tsan.sh: ThreadSanitizer reports in $(ls /tmp/ckptfs-tsan.* | tr '\n' ' ')" >&2
  exit 1
fi
echo "run-tsan.sh: no ThreadSanitizer reports"
