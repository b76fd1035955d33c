#!/usr/bin/env bash
# Runs hub_offline_test.py with the real huggingface_hub, safetensors and
# numpy, from a virtual environment under the build directory that is made
# on first use (python3 -m venv, then pip from PyPI) and reused after.
#   hub_offline_test.sh BUILD_DIR CKPTFS_BINARY
# Exit 77 (ctest: skipped) only when pip cannot fetch the packages, e.g. on
# a machine with no route to PyPI; every other failure fails the test.
set -euo pipefail
build=$1
ckptfs=$2
venv=$build/venv
if [ ! -f "$venv/.ckptfs-ready" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  if ! "$venv/bin/pip" install --quiet --disable-pip-version-check huggingface_hub safetensors numpy; then
    echo "hub_offline_test: cannot install huggingface_hub, safetensors and numpy from PyPI into $venv; skipped" >&2
    exit 77
  fi
  touch "$venv/.ckptfs-ready"
fi
exec "$venv/bin/python" "$(dirname "$0")/hub_offline_test.py" "$ckptfs"
