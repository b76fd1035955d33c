#!/usr/bin/env bash
# Soak run, by hand: readers that verify every digest they read, churn,
# SIGHUP storms, rescans, control-socket floods and bad inputs, all at once,
# against one real mount (see soak.py for what each does and how bytes are
# checked). Prints the figures the README quotes.
# Usage: tests/bench/soak.sh [BUILD_DIR=build] [SECONDS=1800]
# Run as root; it mounts under a temporary directory and unmounts at the end.
set -euo pipefail
build=$(realpath "${1:-build}")
seconds=${2:-1800}
work=$(mktemp -d /tmp/ckptfs-soak.XXXXXX)
cleanup() {
  mountpoint -q "$work/mnt" && fusermount3 -u "$work/mnt"
  rm -rf "$work"
}
trap cleanup EXIT
python3 "$(dirname "$0")/soak.py" "$build/ckptfs" "$build/ckptfsctl" "$work" "$seconds"
status=$?
echo "daemon log: $(grep -c . "$work/daemon.log") lines, $(grep -c ' error' "$work/daemon.log" || true) errors, " \
     "$(grep -c 'repeated' "$work/daemon.log" || true) rate-limited repeats"
exit $status
