#!/usr/bin/env bash
# Builds the Debian packages with Debian's own tools: dpkg-buildpackage over
# packaging/debian (debhelper: dh with cmake+ninja, dpkg-buildflags'
# hardening, dh_strip and its -dbgsym package, dh_compress, dh_installsystemd,
# dh_lintian), then lintian when it is installed.
#   scripts/build-deb.sh [OUT_DIR]     (default: build/deb)
# writes OUT_DIR/ckptfs_<version>-<revision>_<arch>.deb and
# OUT_DIR/ckptfs-dbgsym_<version>-<revision>_<arch>.deb; install with
#   sudo apt-get install ./build/deb/ckptfs_*.deb
# The source tree is copied to a scratch directory under build/ first
# (packaging/debian becoming its debian/), because dpkg-buildpackage builds
# in place and writes its results next to the tree. It prints its progress:
# the compile takes minutes on a small machine.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=$(realpath -m "${1:-build/deb}")
step() { echo "build-deb.sh: $*"; }

step "installing dependencies (packaging/install-deps.sh)"
packaging/install-deps.sh
version=$(dpkg-parsechangelog -l packaging/debian/changelog -S Version)
stage="$repo/build/deb-src"
tree="$stage/ckptfs-${version%-*}"
step "copying the source tree to $tree"
rm -rf "$stage"
mkdir -p "$tree" "$out"
tar -C "$repo" --exclude=./.git --exclude=./build --exclude='./build-*' --exclude=./obj-\* -cf - . | tar -C "$tree" -xf -
cp -a "$tree/packaging/debian" "$tree/debian"

cmake_args=""
if command -v ccache >/dev/null && [ -z "${CCACHE_DISABLE:-}" ]; then
  cmake_args="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"
fi
step "dpkg-buildpackage -b -us -uc (ckptfs $version)"
(cd "$tree" && CKPTFS_DEB_CMAKE_ARGS="$cmake_args" DEB_BUILD_OPTIONS="parallel=$(nproc) ${DEB_BUILD_OPTIONS:-}" \
  dpkg-buildpackage -b -us -uc) \
  || { echo "build-deb.sh: dpkg-buildpackage failed in $tree (above)" >&2; exit 1; }

arch=$(dpkg-architecture -q DEB_HOST_ARCH)
deb="$stage/ckptfs_${version}_${arch}.deb"
dbgsym="$stage/ckptfs-dbgsym_${version}_${arch}.deb"
[ -f "$deb" ] || { echo "build-deb.sh: dpkg-buildpackage wrote no $(basename "$deb") into $stage" >&2; exit 1; }
rm -f "$out"/ckptfs_*.deb "$out"/ckptfs-dbgsym_*.deb
mv "$deb" "$out/"
[ -f "$dbgsym" ] && mv "$dbgsym" "$out/"
rm -rf "$stage"

if command -v lintian >/dev/null; then
  step "lintian -EvIL +pedantic $(basename "$deb")"
  lintian -EvIL +pedantic "$out/$(basename "$deb")" || echo "build-deb.sh: lintian found errors (above)" >&2
fi
step "done"
echo "$out/$(basename "$deb")"
