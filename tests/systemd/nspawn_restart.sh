#!/bin/bash
# By hand, not in ctest: systemd 252 as PID 1 in a systemd-nspawn container
# of Debian 12, running ckptfs@models.service from BUILD_DIR's binaries. A
# reader hashes a file through /models in a loop while the unit is restarted
# (systemctl restart and try-restart, the package's postinst, 8 restarts in
# a row), reloaded, and its supervisor killed with SIGKILL; it must never see an error (ENOTCONN: "Transport
# endpoint is not connected"). `systemctl stop` must then unmount.
#
#   tests/systemd/nspawn_restart.sh BUILD_DIR [ROOTFS]
#
# ROOTFS (default /var/tmp/ckptfs-nspawn) is made with debootstrap when
# missing (needs the systemd-container and debootstrap packages and Debian's
# archive) and removed at the end if this script made it. Needs root and
# /dev/fuse. Exit status 0 when every check held.
set -euo pipefail
trap 'echo "line $LINENO failed: $BASH_COMMAND" >&2' ERR

build=$(realpath "${1:?usage: $0 BUILD_DIR [ROOTFS]}")
root=${2:-/var/tmp/ckptfs-nspawn}
src_dir=$(cd "$(dirname "$0")/../.." && pwd)
machine=ckptfs-nspawn-$$
made_root=0
nspawn_pid=
failures=0

check() {  # check DESCRIPTION COMMAND...: runs COMMAND, counts a failure
  local what=$1
  shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; failures=$((failures + 1)); fi
}

cleanup() {
  if [[ -n $nspawn_pid ]] && kill -0 "$nspawn_pid" 2>/dev/null; then
    # A connection left without a daemon would hold the container's shutdown.
    for c in $(nsenter -t "$leader" -m -- ls /sys/fs/fuse/connections 2>/dev/null); do
      nsenter -t "$leader" -m -- sh -c "echo 1 > /sys/fs/fuse/connections/$c/abort" || true
    done
    kill -TERM "$nspawn_pid" 2>/dev/null || true  # nspawn powers the container off
    for _ in $(seq 100); do kill -0 "$nspawn_pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$nspawn_pid" 2>/dev/null || true
  fi
  if [[ $made_root == 1 ]]; then rm -rf --one-file-system "$root"; fi
}
trap cleanup EXIT

if [[ ! -x $root/lib/systemd/systemd ]]; then
  made_root=1
  debootstrap --variant=minbase \
    --include=systemd,systemd-sysv,dbus,fuse3,libfuse3-3,libssl3,libxxhash0,libsqlite3-0,libspdlog1.10,libfmt9,libsystemd0,procps \
    bookworm "$root" http://deb.debian.org/debian
fi

# The build's binaries and the unit, installed as the package installs them.
install -m 755 "$build/ckptfs" "$build/ckptfsctl" "$root/usr/bin/"
install -m 644 "$src_dir/mount/ckptfs@.service" "$root/etc/systemd/system/ckptfs@.service"
install -m 755 "$src_dir/packaging/debian/postinst" "$root/usr/local/sbin/ckptfs.postinst"
mkdir -p "$root/etc/ckptfs" "$root/srv/checkpoints/m" "$root/models"
echo "CKPTFS_SOURCE=/srv/checkpoints" > "$root/etc/ckptfs/models.conf"
echo "CKPTFS_OPTIONS=settle=0" >> "$root/etc/ckptfs/models.conf"
head -c $((64 << 20)) /dev/urandom > "$root/srv/checkpoints/m/model.safetensors"
want=$(sha256sum < "$root/srv/checkpoints/m/model.safetensors" | cut -d' ' -f1)

systemd-nspawn -D "$root" -b --machine="$machine" --console=passive --register=no --keep-unit \
  --bind=/dev/fuse > "/tmp/$machine.console" 2>&1 < /dev/null &
nspawn_pid=$!
leader=
for _ in $(seq 100); do
  leader=$(pgrep -P "$nspawn_pid" -x systemd || true)
  [[ -n $leader ]] && break
  sleep 0.2
done
[[ -n $leader ]] || { cat "/tmp/$machine.console"; echo "no systemd in the container"; exit 1; }
# Every command in the container has a deadline: a PID 1 that waits on the
# mount (a stat of /models with no daemon) must fail the run, not hang it.
in_ct() { timeout 90 nsenter -t "$leader" -a -- "$@"; }
for _ in $(seq 150); do
  state=$(in_ct systemctl is-system-running 2>/dev/null || true)
  [[ $state == running || $state == degraded ]] && break
  sleep 0.2
done
echo "container $machine: $(in_ct systemctl --version | head -1), system $state"

in_ct systemctl daemon-reload
in_ct systemctl enable --now ckptfs@models.service
for _ in $(seq 100); do in_ct test -L /models/by-name/m && break; sleep 0.2; done
in_ct findmnt /models

# The reader: one line per pass, "ok" or what failed.
nsenter -t "$leader" -a -- sh -c "while :; do if s=\$(sha256sum < /models/by-name/m/model.safetensors 2>&1); then
  [ \"\${s%% *}\" = $want ] && echo ok || echo wrong; else echo \"error: \$s\"; fi; done" \
  > "/tmp/$machine.reader" 2>&1 &
reader=$!
sleep 2
# "postinst": the package's postinst as dpkg runs it after an upgrade;
# "kill-main": SIGKILL to the supervisor (Restart=always brings it back).
for action in restart restart try-restart reload postinst kill-main restart; do
  before=$(in_ct systemctl show -p MainPID --value ckptfs@models.service)
  start=$(date +%s.%N)
  if [[ $action == postinst ]]; then
    check "postinst configure 0.0.1-1" in_ct /usr/local/sbin/ckptfs.postinst configure 0.0.1-1
  elif [[ $action == kill-main ]]; then
    check "systemctl kill --kill-who=main -s KILL" in_ct systemctl kill --kill-who=main -s KILL ckptfs@models.service
    sleep 3  # RestartSec=1, then the new supervisor's start
  else
    check "systemctl $action ckptfs@models.service" in_ct systemctl "$action" ckptfs@models.service
  fi
  took=$(echo "$(date +%s.%N) - $start" | bc)
  after=$(in_ct systemctl show -p MainPID --value ckptfs@models.service)
  echo "$action: ${took} s, supervisor pid $before -> $after, $(in_ct findmnt -n -o FSTYPE /models)"
  sleep 2
done
# Restarts in quick succession: more starts than systemd's default start
# limit (5 in 10 s), which would fail the unit and close the stored descriptor.
burst_ok=0
for _ in $(seq 8); do in_ct systemctl restart ckptfs@models.service && burst_ok=$((burst_ok + 1)); done
check "8 restarts in a row: $burst_ok succeeded" test "$burst_ok" -eq 8
sleep 2
kill "$reader"
wait "$reader" 2>/dev/null || true
passes=$(grep -c '^ok$' "/tmp/$machine.reader" || true)
bad=$(grep -vc '^ok$' "/tmp/$machine.reader" || true)
echo "reader: $passes passes of 64 MiB, $bad failed"
grep -v '^ok$' "/tmp/$machine.reader" | sort | uniq -c | head || true
check "the reader never failed" test "$bad" -eq 0
check "the reader read during the restarts" test "$passes" -gt 5
check "/models is still mounted" in_ct findmnt /models
in_ct journalctl -b -u ckptfs@models.service --no-pager -o cat | grep -E "SIGTERM|took the FUSE|keeping|serves now|hand" | tail -20

in_ct systemctl stop ckptfs@models.service
check "systemctl stop unmounts" bash -c "! nsenter -t $leader -a -- findmnt /models > /dev/null"
in_ct journalctl -b -u ckptfs@models.service --no-pager -o cat | tail -3
rm -f "/tmp/$machine.reader" "/tmp/$machine.console"
echo "$failures check(s) failed"
exit $((failures > 0))
