#!/usr/bin/env bash
# The operator's path, end to end, on this machine: build the .deb, install it
# with apt-get, mount a generated tree through a private fstab line of type
# `ckptfs` (so /usr/sbin/mount.ckptfs and /usr/bin/ckptfs from the package do
# the work), read through it, `ckptfsctl status`, unmount; then
# `apt-get remove` (the index in /var/lib/ckptfs stays) and `apt-get purge`
# (it goes, with /run/ckptfs and every path the package installed).
# Usage: test_deb.sh DEB_DIR DEMO_TREE_TOOL (DEB_DIR: where
# scripts/build-deb.sh put the package). Needs root. Always unmounts and
# purges what it installed, even when a step fails.
#
# Purge deletes /var/lib/ckptfs and /run/ckptfs, which daemons started outside
# this test (other mounts, other test runs on a shared machine) may be using.
# So the test runs in a mount namespace of its own in which /var/lib and /run
# are overlays with a scratch upper layer: there it starts without
# /var/lib/ckptfs and /run/ckptfs, and purge deletes only what the test made.
# The dpkg and apt databases are bind-mounted through, so the install itself
# is real, and a plain `apt-get purge ckptfs` undoes it should the test be
# killed.
set -euo pipefail
debs_dir=$1
make_tree=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

if [ -z "${CKPTFS_DEB_TEST_OUTER_NS:-}" ]; then
  [ "$(id -u)" -eq 0 ] || fail "must run as root (apt-get install, mount)"
  command -v unshare >/dev/null || fail "unshare is missing (util-linux; packaging/install-deps.sh installs it)"
  CKPTFS_DEB_TEST_OUTER_NS=$(readlink /proc/self/ns/mnt) exec unshare --mount --propagation private -- "$0" "$@"
fi
[ "$(readlink /proc/self/ns/mnt)" != "$CKPTFS_DEB_TEST_OUTER_NS" ] \
  || fail "unshare gave this test no mount namespace of its own; refusing to purge the machine's /var/lib/ckptfs"

# Empty when dpkg does not know the package or it is purged; otherwise its
# status ("install ok installed", "deinstall ok config-files", ...).
package_status() {
  local s
  s=$(dpkg-query -W -f='${Status}' ckptfs 2>/dev/null) || return 0
  case $s in *not-installed) ;; *) echo "$s" ;; esac
}
status=$(package_status)
[ -z "$status" ] || fail "ckptfs is already on this machine ($status); this test installs and purges its own (apt-get purge ckptfs first)"

work=$(mktemp -d /tmp/ckptfs-deb.XXXXXX)
cleanup() {
  if mountpoint -q "$work/models"; then umount "$work/models" || fusermount3 -u -z "$work/models"; fi
  if [ -n "$(package_status)" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq ckptfs >/dev/null
  fi
  if mountpoint -q "$work/ns"; then umount -R "$work/ns" || umount -R -l "$work/ns"; fi
  # Never recurse into a mount (the scratch tmpfs once held a bind of the
  # real /var/lib/dpkg): leave the directory behind instead.
  local mounts
  mounts=$(findmnt -rn -o TARGET)
  if grep -q "^$work/" <<<"$mounts"; then
    echo "test_deb.sh: $work still has mounts below it; leaving it in place" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT

# The scratch layers live on a tmpfs of this namespace (overlayfs takes no
# upper layer on overlayfs) and vanish with it.
ns=$work/ns
mkdir "$ns"
mount -t tmpfs -o mode=0700 ckptfs-deb-test "$ns" || fail "cannot mount a tmpfs on $ns"
mkdir "$ns/dpkg" "$ns/apt" "$ns/var-lib.upper" "$ns/var-lib.work" "$ns/run.upper" "$ns/run.work"
mount --bind /var/lib/dpkg "$ns/dpkg" || fail "cannot bind-mount /var/lib/dpkg on $ns/dpkg"
mount --bind /var/lib/apt "$ns/apt" || fail "cannot bind-mount /var/lib/apt on $ns/apt"
mount -t overlay ckptfs-deb-test -o "lowerdir=/var/lib,upperdir=$ns/var-lib.upper,workdir=$ns/var-lib.work" /var/lib \
  || fail "cannot mount an overlay on /var/lib (the test needs overlayfs)"
mount --bind "$ns/dpkg" /var/lib/dpkg || fail "cannot bind the real /var/lib/dpkg back into the overlay"
mount --bind "$ns/apt" /var/lib/apt || fail "cannot bind the real /var/lib/apt back into the overlay"
umount "$ns/dpkg" "$ns/apt" || fail "cannot unmount the staging binds $ns/dpkg and $ns/apt"
mount -t overlay ckptfs-deb-test -o "lowerdir=/run,upperdir=$ns/run.upper,workdir=$ns/run.work" /run \
  || fail "cannot mount an overlay on /run (the test needs overlayfs)"
for d in /var/lib /run; do
  [ "$(findmnt -n -o FSTYPE "$d")" = overlay ] || fail "$d is not the test's overlay; refusing to delete under it"
done
[ "$(findmnt -n -o FSTYPE /var/lib/dpkg)" != overlay ] || fail "/var/lib/dpkg is the overlay's copy, not the real database"
# From here on only this test's state: what other daemons keep there is
# hidden, not deleted (these are whiteouts in the scratch layers).
rm -rf /var/lib/ckptfs /run/ckptfs

# The package package.deb_build made (scripts/build-deb.sh, which leaves
# only the newest one there).
debs=("$debs_dir"/ckptfs_*.deb)
[ -f "${debs[0]}" ] || fail "no ckptfs_*.deb in $debs_dir (scripts/build-deb.sh $debs_dir makes it)"
[ "${#debs[@]}" -eq 1 ] || fail "${#debs[@]} packages named ckptfs_*.deb in $debs_dir"
deb=${debs[0]}
cp "$deb" "$work/"
deb="$work/$(basename "$deb")"

# Every path the package holds, and which of them were here before it: after
# purge exactly those must remain.
dpkg-deb --fsys-tarfile "$deb" | tar -t | sed -e 's|^\./|/|' -e 's|/$||' | grep -v '^$' >"$work/paths" \
  || fail "cannot list the contents of $deb"
while IFS= read -r p; do
  if [ -e "$p" ] || [ -L "$p" ]; then echo "$p"; fi
done <"$work/paths" >"$work/paths.before"

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
# Each checkpoint of a first mount appears as its hashing ends: all six in time.
for _ in $(seq 1 200); do
  status=$(/usr/bin/ckptfsctl status "$work/models") || fail "ckptfsctl status failed"
  grep -q "6 exposed" <<<"$status" && break
  sleep 0.05
done
grep -q "6 exposed" <<<"$status" || fail "unexpected status: $status"
resolved=$(/usr/bin/ckptfsctl resolve "$work/models/by-name/finetune") || fail "ckptfsctl resolve failed"
[[ "$resolved" == "$work/models/sha256-"* ]] || fail "resolve printed $resolved"
umount "$work/models" || fail "umount failed"
mountpoint -q "$work/models" && fail "still mounted after umount"
# The same line with type fuse.ckptfs goes through mount.fuse3 to the installed
# daemon; without state= it keeps its index where root's goes by default,
# /var/lib/ckptfs, the directory that purge (and only purge) removes.
sed -i -e 's/ ckptfs ro,/ fuse.ckptfs ro,/' -e 's/,state=[^, ]*//' "$work/fstab"
mount -T "$work/fstab" "$work/models" || fail "mount -T of a type-fuse.ckptfs fstab line failed"
for _ in $(seq 1 200); do [ -L "$work/models/by-name/base" ] && break; sleep 0.05; done
cmp "$work/models/by-name/base/config.json" "$work/src/base/config.json" || fail "fuse.ckptfs mount: bytes differ"
[ -f /var/lib/ckptfs/index.db ] || fail "the mount without state= made no /var/lib/ckptfs/index.db"
[ -d /run/ckptfs ] || fail "the mount made no /run/ckptfs for its control socket"
umount "$work/models" || fail "umount of the fuse.ckptfs mount failed"

DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq ckptfs >/dev/null || fail "apt-get remove failed"
[ ! -e /usr/bin/ckptfs ] || fail "/usr/bin/ckptfs is still there after remove"
[ -f /var/lib/ckptfs/index.db ] || fail "apt-get remove deleted /var/lib/ckptfs/index.db (only purge may)"
[ -d /run/ckptfs ] || fail "apt-get remove deleted /run/ckptfs (only purge may)"
# A package with a postrm stays known to dpkg after remove, so that purge can
# still run it.
status=$(package_status)
[[ "$status" == *config-files ]] \
  || fail "after apt-get remove dpkg has ckptfs as '${status:-unknown}', not config-files: purge has no postrm left to remove /var/lib/ckptfs"

DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq ckptfs >/dev/null || fail "apt-get purge failed"
status=$(package_status)
[ -z "$status" ] || fail "dpkg still knows ckptfs after purge ($status)"
[ ! -e /var/lib/ckptfs ] || fail "/var/lib/ckptfs is still there after purge"
[ ! -e /run/ckptfs ] || fail "/run/ckptfs is still there after purge"
while IFS= read -r p; do
  if grep -qxF -- "$p" "$work/paths.before"; then
    [ -e "$p" ] || [ -L "$p" ] || fail "purge removed $p, which was there before the package"
  else
    [ ! -e "$p" ] && [ ! -L "$p" ] || fail "$p, installed by the package, is still there after purge"
  fi
done <"$work/paths"
echo "package test: built $(basename "$deb"), installed, mounted through fstab types ckptfs and fuse.ckptfs, read, status, resolve, unmounted; remove kept /var/lib/ckptfs; purge left none of /var/lib/ckptfs, /run/ckptfs and the $(wc -l <"$work/paths") paths of the package"
