#!/usr/bin/env bash
# The operator's path, end to end, on this machine: build the .deb, install it
# with apt-get, mount a generated tree through a private fstab line of type
# `ckptfs` (so /usr/sbin/mount.ckptfs and /usr/bin/ckptfs from the package do
# the work), read through it, `ckptfsctl status`, unmount, purge.
# Usage: test_deb.sh BUILD_DIR DEMO_TREE_TOOL. Needs root. Always unmounts and
# purges what it installed, even when a step fails.
set -euo pipefail
build=$1
make_tree=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

if dpkg-query -W -f='${Status}' ckptfs 2>/dev/null | grep -q 'install ok installed'; then
  fail "a ckptfs package is already installed; this test installs and purges its own (apt-get purge ckptfs first)"
fi
work=$(mktemp -d /tmp/ckptfs-deb.XXXXXX)
cleanup() {
  if mountpoint -q "$work/models"; then umount "$work/models" || fusermount3 -u -z "$work/models"; fi
  if dpkg-query -W -f='${Status}' ckptfs 2>/dev/null | grep -q 'install ok'; then
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq ckptfs >/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# A scratch output directory, so a package left in BUILD_DIR by an older
# version is never the one installed.
(cd "$build" && cpack -G DEB -B "$work/pkg" >"$work/cpack.log" 2>&1) \
  || { cat "$work/cpack.log" >&2; fail "cpack could not build the package from $build"; }
debs=("$work"/pkg/ckptfs_*.deb)
[ -f "${debs[0]}" ] || fail "cpack wrote no ckptfs_*.deb into $work/pkg"
deb=${debs[0]}
cp "$deb" "$work/"
deb="$work/$(basename "$deb")"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$deb" >/dev/null \
  || fail "apt-get install of $(basename "$deb") failed"
for f in /usr/bin/ckptfs /usr/bin/ckptfsctl /usr/sbin/mount.ckptfs /usr/share/man/man8/ckptfs.8.gz \
         /usr/share/man/man8/ckptfsctl.8.gz /usr/share/man/man8/mount.ckptfs.8.gz \
         /usr/lib/systemd/system/models.mount /usr/lib/systemd/system/models.automount \
         /usr/share/doc/ckptfs/examples/fstab.example /usr/share/doc/ckptfs/copyright \
         /usr/share/doc/ckptfs/changelog.Debian.gz; do
  [ -e "$f" ] || fail "the package did not install $f"
done

"$make_tree" "$work/src" || fail "$make_tree could not build the test tree in $work/src"
mkdir -p "$work/models"
echo "$work/src $work/models ckptfs ro,allow_other,nofail,_netdev,x-systemd.device-timeout=10,state=$work/state,settle=0 0 0" \
  >"$work/fstab"
mount -T "$work/fstab" "$work/models" || fail "mount -T of a type-ckptfs fstab line failed"
grep -q " $work/models fuse.ckptfs " /proc/self/mounts || fail "no fuse.ckptfs mount at $work/models"
for _ in $(seq 1 200); do [ -L "$work/models/by-name/finetune" ] && break; sleep 0.05; done
[ -L "$work/models/by-name/finetune" ] || fail "by-name/finetune did not appear"
cmp "$work/models/by-name/finetune/model-00002-of-00002.safetensors" \
    "$work/src/finetune/model-00002-of-00002.safetensors" || fail "bytes read through the mount differ"
status=$(/usr/bin/ckptfsctl status "$work/models") || fail "ckptfsctl status failed"
grep -q "6 exposed" <<<"$status" || fail "unexpected status: $status"
resolved=$(/usr/bin/ckptfsctl resolve "$work/models/by-name/finetune") || fail "ckptfsctl resolve failed"
[[ "$resolved" == "$work/models/sha256-"* ]] || fail "resolve printed $resolved"
umount "$work/models" || fail "umount failed"
mountpoint -q "$work/models" && fail "still mounted after umount"
# The same line with type fuse.ckptfs goes through mount.fuse3 to the installed daemon.
sed -i 's/ ckptfs ro,/ fuse.ckptfs ro,/' "$work/fstab"
mount -T "$work/fstab" "$work/models" || fail "mount -T of a type-fuse.ckptfs fstab line failed"
for _ in $(seq 1 200); do [ -L "$work/models/by-name/base" ] && break; sleep 0.05; done
cmp "$work/models/by-name/base/config.json" "$work/src/base/config.json" || fail "fuse.ckptfs mount: bytes differ"
umount "$work/models" || fail "umount of the fuse.ckptfs mount failed"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq ckptfs >/dev/null || fail "apt-get purge failed"
[ ! -e /usr/bin/ckptfs ] || fail "/usr/bin/ckptfs is still there after purge"
echo "package test: built $(basename "$deb"), installed, mounted through fstab types ckptfs and fuse.ckptfs, read, status, resolve, unmounted, purged"
