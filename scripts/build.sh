#!/usr/bin/env bash
# Installs the dependencies (packaging/install-deps.sh) and builds ckptfs into
# ./build. Used by the quick-start scripts and CI; safe to run again. Extra
# arguments go to cmake's configure step (scripts/run-tests.sh asks for line
# tables only: -g1).
set -euo pipefail
cd "$(dirname "$0")/.."
packaging/install-deps.sh
# CMakePresets.json's dev: RelWithDebInfo into build/.
cmake --preset dev -DCKPTFS_WERROR="${CKPTFS_WERROR:-ON}" "$@" >/dev/null
cmake --build --preset dev --parallel "$(nproc)"
