#!/usr/bin/env bash
# Builds the Debian package: build/ckptfs_<version>_<arch>.deb
# Install it with: sudo apt-get install ./build/ckptfs_*.deb
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >/dev/null
(cd build && cpack -G DEB >/dev/null)
ls "$PWD"/build/ckptfs_*.deb
