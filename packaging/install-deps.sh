#!/usr/bin/env bash
# Installs every Debian package that building, testing and running ckptfs needs
# on a fresh Debian 12 machine. Idempotent: packages already present are left
# alone, and apt-get update runs only when something is missing.
set -euo pipefail

packages=(
  build-essential cmake pkg-config ninja-build dpkg-dev   # dpkg-dev: dpkg-buildpackage for the .deb
  debhelper                   # the .deb's debian/rules (dh), scripts/build-deb.sh
  libfuse3-dev fuse3          # the FUSE low-level API and fusermount3
  libssl-dev                  # SHA-256 (OpenSSL's SHA256_* functions)
  libxxhash-dev               # XXH3-128 chunk checks
  libsqlite3-dev sqlite3      # the index
  libspdlog-dev               # logging
  nlohmann-json3-dev          # JSON output and safetensors headers
  libcli11-dev                # ckptfsctl argument parsing
  libacl1-dev acl             # POSIX ACLs of the source (the access rule), setfacl for the tests
  libgtest-dev                # the test suite
  libsystemd-dev              # the fd store that keeps a mount across a supervisor restart (ckptfs@.service)
  clang libclang-rt-14-dev    # the libFuzzer target (tests/fuzz), -Wthread-safety (scripts/check-thread-safety.sh)
  coreutils findutils attr util-linux python3   # tools the tests compare against
  lintian python3-debian      # the package test: Debian's checks, and a DEP-5 parser for the copyright file
  python3-venv                # the huggingface_hub test's virtual environment (build/venv)
  sshfs openssh-server openssh-client   # the fleet test's network filesystem: sshfs over loopback
  python3-yaml                # the Kubernetes manifests test parses deploy/kubernetes/*.yaml
)

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps.sh: must run as root (it calls apt-get install)" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps.sh: all ${#packages[@]} packages already installed"
  exit 0
fi

echo "install-deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
