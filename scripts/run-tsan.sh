#!/usr/bin/env bash
# ThreadSanitizer run, part of the CI test command (scripts/run-tests.sh runs
# it after the normal suite). Builds the daemon, ckptfsctl and the unit tests
# with TSan into ./build-tsan; runs the unit tests (the classes' own threads)
# and, on a second lane at the same time, the security suite and the
# integration tests that drive the daemon hardest (mounts, caches,
# passthrough, teardown) from the normal build (./build, made first if
# missing) against the TSan daemon (CKPTFS_TEST_DAEMON, CKPTFS_TEST_CTL):
# the races that matter are the daemon's, and the test binaries need no
# second build. The reports go to /tmp/ckptfs-tsan.PID. Exits non-zero on
# any test failure or report. CKPTFS_TSAN_NO_DEPS=1 skips
# packaging/install-deps.sh (run-tests.sh has just run it); --build-only
# builds and stops (run-tests.sh builds while the normal suite runs).
set -euo pipefail
build_only=0
[ "${1:-}" = --build-only ] && build_only=1
cd "$(dirname "$0")/.."
if [[ "${CKPTFS_TSAN_NO_DEPS:-0}" != 1 ]]; then packaging/install-deps.sh; fi
[ -f build/build.ninja ] || CKPTFS_WERROR=ON scripts/build.sh
cmake --build build --parallel "$(nproc)" --target ckptfs_security_tests ckptfs_integration_tests \
  ckptfs-make-demo-tree ckptfs-test-faultyfs ckptfs-test-compare-tree
# CMakePresets.json's tsan: -fsanitize=thread at -O1 -g1 (what TSan's
# documentation advises, with line tables for its stacks), into build-tsan/.
launcher=(); if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake --preset tsan "${launcher[@]}" >/dev/null
cmake --build --preset tsan --parallel "$(nproc)"
[ "$build_only" = 1 ] && exit 0
rm -f /tmp/ckptfs-tsan.*
export TSAN_OPTIONS="halt_on_error=0 report_signal_unsafe=0 log_path=/tmp/ckptfs-tsan"
logs=$(mktemp -d /tmp/ckptfs-tsan-logs.XXXXXX)
# Left out, to keep CI well under its 30 minutes on 2 cores (TSan runs code
# 5 to 15 times slower): single-threaded scale tests of the header parser
# (2 minutes and more under TSan, nothing shared), the 2,000-checkpoint mount
# and the open/close count test (scale, not concurrency); and
# RefusedPinningGoesOnUnpinned, because under TSan the runtime's own mappings
# change what mlock reports.
unit_lane() {
  build-tsan/tests/ckptfs_unit_tests \
    --gtest_filter='-SafetensorsHeaderTest.HundredsOfThousandsOfTensorsParseAndStamp:SafetensorsHeaderTest.ManyMetadataKeysParseAndStamp:SafetensorsHeaderTest.HeaderSizeLimit'
}
daemon_lane() {
  export CKPTFS_TEST_DAEMON=$PWD/build-tsan/ckptfs CKPTFS_TEST_CTL=$PWD/build-tsan/ckptfsctl
  build/tests/ckptfs_security_tests
  build/tests/ckptfs_integration_tests \
    --gtest_filter='MountTest.*:CacheMountTest.*:Passthrough*:TeardownTest.*:-CacheMountTest.RefusedPinningGoesOnUnpinned:MountTest.ThousandsOfCheckpoints:PassthroughMountTest.OpensAndClosesDoNotAccumulateBackingIdsOrInodes'
}
unit_lane >"$logs/unit.log" 2>&1 &
unit_pid=$!
status=0
daemon_lane >"$logs/daemon.log" 2>&1 || status=1
wait "$unit_pid" || status=1
for lane in unit daemon; do
  echo "=== run-tsan.sh: the $lane lane (last lines; all of it in $logs/$lane.log)"
  tail -n 40 "$logs/$lane.log"
done
if [ "$status" != 0 ]; then
  echo "run-tsan.sh: a test failed; see the lanes above" >&2
  grep -h -E '^\[  FAILED  \]' "$logs"/*.log >&2 || true
fi
if ls /tmp/ckptfs-tsan.* >/dev/null 2>&1; then
  echo "run-tsan.sh: ThreadSanitizer reports in $(ls /tmp/ckptfs-tsan.* | tr '\n' ' ')" >&2
  for r in /tmp/ckptfs-tsan.*; do head -n 60 "$r" >&2; done
  exit 1
fi
[ "$status" = 0 ] || exit 1
rm -rf "$logs"  # kept above for a failure to be read; nothing to read now
echo "run-tsan.sh: no ThreadSanitizer reports"
