#!/usr/bin/env bash
# Runs one file of the engines tests with pytest from the virtual
# environment setup.sh made.
#   run_pytest.sh BUILD_DIR CKPTFS_BINARY TEST_FILE [PYTEST_ARGS...]
# Exit 77 (ctest: skipped) when the environment is missing because PyPI
# could not be reached (setup.sh was skipped); every other failure fails.
set -euo pipefail
build=$(realpath "$1")
here=$(dirname "$(realpath "$0")")
venv=$build/venv-engines
if [ ! -f "$venv/.ckptfs-ready" ] || [ ! -f "$build/engines-models/.ckptfs-ready" ]; then
  echo "run_pytest: $venv or $build/engines-models is missing (setup.sh could not reach PyPI); skipped" >&2
  exit 77
fi
export CKPTFS_BINARY=$(realpath "$2") CKPTFS_TEST_MODELS=$build/engines-models
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
cd "$here"
exec "$venv/bin/python" -m pytest -p no:cacheprovider -q -rs "$3" "${@:4}"
