#!/usr/bin/env bash
# ctest fixture of the engines tests: the virtual environment
# (make_venv.sh) and the tiny Qwen3 checkpoints (make_models.py), both made
# once and reused.
#   setup.sh BUILD_DIR
set -euo pipefail
build=$(realpath "$1")
here=$(dirname "$(realpath "$0")")
"$here/make_venv.sh" "$build"
exec 9>"$build/.engines-models.lock"
flock 9
"$build/venv-engines/bin/python" "$here/make_models.py" "$build/engines-models"
