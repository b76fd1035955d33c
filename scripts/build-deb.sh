#!/usr/bin/env bash
# Builds the Debian package: build/ckptfs_<version>-<revision>_<arch>.deb
# Install it with: sudo apt-get install ./build/ckptfs_*.deb
# Prints its progress: the compile alone takes minutes on a small machine
# (ninja counts [done/total] steps), then cpack's steps, then lintian's
# verdict when lintian is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "build-deb.sh: $*"; }

step "installing dependencies and building into $PWD/build (scripts/build.sh)"
scripts/build.sh || { echo "build-deb.sh: scripts/build.sh failed (above); no package built" >&2; exit 1; }

step "packaging with cpack"
log=$(mktemp /tmp/ckptfs-cpack.XXXXXX)
trap 'rm -f "$log"' EXIT
(cd build && cpack -G DEB) | tee "$log" \
  || { echo "build-deb.sh: cpack failed in $PWD/build (above)" >&2; exit 1; }
# The package cpack reports, not a glob: build/ may hold packages of older
# versions.
deb=$(sed -n 's/^CPack: - package: \(.*\.deb\) generated\.$/\1/p' "$log")
[ -n "$deb" ] && [ -f "$deb" ] || { echo "build-deb.sh: cpack reported no .deb (output above)" >&2; exit 1; }

if command -v lintian >/dev/null; then
  step "lintian -EvIL +pedantic $(basename "$deb")"
  lintian -EvIL +pedantic "$deb" || echo "build-deb.sh: lintian found errors (above)" >&2
fi
step "done"
echo "$deb"
