#!/usr/bin/env bash
# A real network filesystem on one machine, for tests and benchmarks: an
# OpenSSH server on a free loopback port (its own host key, config and
# authorized key, all under WORK) and sshfs mounting REMOTE through it.
#
#   sshfs_loopback.sh start WORK REMOTE MOUNTPOINT [SSHFS_OPTIONS]
#   sshfs_loopback.sh requests WORK     SFTP requests the server has answered
#   sshfs_loopback.sh stop WORK         unmount, stop sshfs and sshd (by PID)
#
# The SFTP server logs every request (sftp-server -l DEBUG3), so a caller can
# count what a scan costs on the wire. Needs root (sshd), sshfs and
# openssh-server (packaging/install-deps.sh).
set -euo pipefail

cmd=${1:?usage: sshfs_loopback.sh start|requests|stop WORK ...}
work=${2:?WORK directory missing}

start() {
  local remote=$1 mnt=$2 opts=${3:-}
  mkdir -p "$work" "$mnt" /run/sshd
  ssh-keygen -q -t ed25519 -N '' -f "$work/host_key" <<<y >/dev/null
  ssh-keygen -q -t ed25519 -N '' -f "$work/client_key" <<<y >/dev/null
  cp "$work/client_key.pub" "$work/authorized_keys"
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat >"$work/sftp-server" <<SH
#!/bin/sh
exec /usr/lib/openssh/sftp-server -e -l DEBUG3 2>>"$work/sftp.log"
SH
  chmod 755 "$work/sftp-server"
  cat >"$work/sshd_config" <<CONF
Port $port
ListenAddress 127.0.0.1
HostKey $work/host_key
AuthorizedKeysFile $work/authorized_keys
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
PidFile $work/sshd.pid
Subsystem sftp $work/sftp-server
CONF
  /usr/sbin/sshd -f "$work/sshd_config" -E "$work/sshd.log"
  for _ in $(seq 100); do
    [ -s "$work/sshd.pid" ] && python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null && break
    sleep 0.05
  done
  # Foreground sshfs in the background, so that its PID is known.
  sshfs -f -o "port=$port,IdentityFile=$work/client_key,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null" \
    -o "BatchMode=yes,LogLevel=ERROR${opts:+,$opts}" "root@127.0.0.1:$remote" "$mnt" \
    </dev/null >"$work/sshfs.log" 2>&1 &
  echo $! >"$work/sshfs.pid"
  echo "$mnt" >"$work/mountpoint"
  for _ in $(seq 200); do
    mountpoint -q "$mnt" && return 0
    kill -0 "$(cat "$work/sshfs.pid")" 2>/dev/null || break
    sleep 0.05
  done
  echo "sshfs_loopback.sh: sshfs did not mount $mnt:" >&2
  cat "$work/sshfs.log" "$work/sshd.log" >&2 || true
  return 1
}

requests() {
  grep -c 'request [0-9]*: sent' "$work/sftp.log" 2>/dev/null || echo 0
}

stop() {
  local mnt
  mnt=$(cat "$work/mountpoint" 2>/dev/null || true)
  if [ -n "$mnt" ] && mountpoint -q "$mnt"; then fusermount3 -u "$mnt" || fusermount3 -u -z "$mnt" || true; fi
  for f in sshfs.pid sshd.pid; do
    if [ -s "$work/$f" ]; then kill "$(cat "$work/$f")" 2>/dev/null || true; rm -f "$work/$f"; fi
  done
}

case $cmd in
  start) shift 2; start "$@" ;;
  requests) requests ;;
  stop) stop ;;
  *) echo "sshfs_loopback.sh: unknown command $cmd" >&2; exit 2 ;;
esac
