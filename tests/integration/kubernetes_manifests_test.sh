#!/usr/bin/env bash
# Runs kubernetes_manifests_test.py. Schema validation needs
# kubernetes-validate from PyPI, installed on first use into a virtual
# environment under the build directory (build/venv-k8s) and reused after;
# without PyPI the field checks still run with Debian's python3-yaml.
#   kubernetes_manifests_test.sh BUILD_DIR CKPTFS_BINARY
set -euo pipefail
build=$1
ckptfs=$2
here=$(dirname "$(realpath "$0")")
venv=$build/venv-k8s
python=/usr/bin/python3
if [ ! -f "$venv/.ckptfs-ready" ]; then
  rm -rf "$venv"
  if /usr/bin/python3 -m venv "$venv" &&
     "$venv/bin/pip" install --quiet --disable-pip-version-check kubernetes-validate PyYAML; then
    touch "$venv/.ckptfs-ready"
  else
    echo "kubernetes_manifests_test: cannot install kubernetes-validate from PyPI; checking fields only" >&2
  fi
fi
[ -f "$venv/.ckptfs-ready" ] && python=$venv/bin/python
exec "$python" "$here/kubernetes_manifests_test.py" "$here/../.." "$ckptfs"
