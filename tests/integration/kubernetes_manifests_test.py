"""deploy/kubernetes/ carries what a fleet node needs (issue 15): the DaemonSet
runs ckptfs privileged with /dev/fuse, the shared source read-only, /models
on the host with Bidirectional propagation, a readiness probe from
`ckptfsctl status`, metrics for node_exporter, the signing key from a Secret;
the inference pod mounts /models with HostToContainer; the image is built
from the .deb; the daemon accepts the DaemonSet's options. With
kubernetes-validate installed, every object is also checked against the
Kubernetes schema (strict: unknown fields are errors).

usage: kubernetes_manifests_test.py SOURCE_DIR CKPTFS_BINARY
"""
import copy
import os
import re
import subprocess
import sys

import yaml

try:
    import kubernetes_validate
except ImportError:
    kubernetes_validate = None

source_dir, ckptfs = sys.argv[1], sys.argv[2]
deploy = os.path.join(source_dir, "deploy", "kubernetes")
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def load(name):
    with open(os.path.join(deploy, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def by_name(items, name):
    return next((i for i in items if i.get("name") == name), None)


def volume_of(pod, container, mount_path):
    mount = next((m for m in container.get("volumeMounts", []) if m["mountPath"] == mount_path), None)
    volume = by_name(pod["volumes"], mount["name"]) if mount else None
    return mount, volume


ds = load("daemonset.yaml")[0]
check(ds["kind"] == "DaemonSet", "daemonset.yaml holds a DaemonSet")
check(ds["spec"].get("updateStrategy", {}).get("type") == "OnDelete", "updateStrategy OnDelete (upgrade by drain)")
pod = ds["spec"]["template"]["spec"]
main = by_name(pod["containers"], "ckptfs")
env = {e["name"]: e.get("value", "") for e in main.get("env", [])}
check(main.get("securityContext", {}).get("privileged") is True, "the ckptfs container is privileged")
check(pod.get("hostPID") is True, "hostPID: the daemon reads its callers' supplementary groups from /proc/PID")

mount, volume = volume_of(pod, main, "/dev/fuse")
check(volume and volume.get("hostPath", {}).get("path") == "/dev/fuse", "/dev/fuse comes from the host")
check(volume and volume.get("hostPath", {}).get("type") == "CharDevice", "/dev/fuse is a CharDevice")

mount, volume = volume_of(pod, main, env.get("CKPTFS_SOURCE", ""))
check(mount and mount.get("readOnly") is True, "the shared source is mounted read-only at CKPTFS_SOURCE")

mount, volume = volume_of(pod, main, env.get("CKPTFS_MOUNTPOINT", ""))
check(mount and mount.get("mountPropagation") == "Bidirectional", "/models propagates Bidirectional")
check(volume and volume.get("hostPath", {}).get("path") == "/models", "/models is a host path")

probe = main.get("readinessProbe", {}).get("exec", {}).get("command", [])
check(probe[:2] == ["ckptfsctl", "status"] and probe[-1] == env.get("CKPTFS_MOUNTPOINT"),
      "readiness from `ckptfsctl status MOUNTPOINT`")
check("livenessProbe" not in main, "no liveness probe (a restart would break every consumer's mount)")

options = re.sub(r"\s", "", env.get("CKPTFS_OPTIONS", ""))
opts = dict(o.split("=", 1) if "=" in o else (o, "") for o in options.split(","))
secret_mounts = [m for m in main["volumeMounts"] if (by_name(pod["volumes"], m["name"]) or {}).get("secret")]
check(len(secret_mounts) == 1, "the signing key comes from a Secret")
for key in ("manifest_sign", "manifest_keys"):
    check(any(opts.get(key, "").startswith(m["mountPath"] + "/") for m in secret_mounts),
          key + "= lies in the Secret's mount")
check(any(opts.get("manifests", "") == m["mountPath"] for m in main["volumeMounts"]),
      "manifests= is a mounted volume")

metrics = by_name(pod["containers"], "metrics")
check(metrics is not None and "ckptfs-metrics" in " ".join(metrics.get("command", [])), "a metrics container")
if metrics:
    menv = {e["name"]: e.get("value", "") for e in metrics.get("env", [])}
    mount, volume = volume_of(pod, metrics, menv.get("CKPTFS_TEXTFILE_DIR", ""))
    check(volume and "hostPath" in volume, "metrics go to node_exporter's textfile directory on the host")
    mount, volume = volume_of(pod, metrics, "/models")
    check(mount and mount.get("mountPropagation") == "HostToContainer", "the metrics container sees /models")
    shared = {m["name"] for m in main["volumeMounts"]} & {m["name"] for m in metrics["volumeMounts"]}
    check(any(m["mountPath"] == "/run/ckptfs" and m["name"] in shared for m in metrics["volumeMounts"]),
          "the control socket directory is shared with the metrics container")

# The daemon itself accepts the options: it gets past parsing (exit 2 would
# be a bad option) and stops at the missing source.
run = subprocess.run([ckptfs, "/nonexistent/src", "/nonexistent/mnt", "-f", "-o", options],
                     capture_output=True, text=True, timeout=30)
check(run.returncode == 1 and "/nonexistent/src" in run.stderr,
      "ckptfs accepts the DaemonSet's options (exit %d: %s)" % (run.returncode, run.stderr.strip()))

inference = load("inference-pod.yaml")[0]
ipod = inference["spec"]
engine = ipod["containers"][0]
mount, volume = volume_of(ipod, engine, "/models")
check(mount and mount.get("mountPropagation") == "HostToContainer", "the inference pod uses HostToContainer")
check(mount and mount.get("readOnly") is True, "the inference pod mounts /models read-only")
check(volume and volume.get("hostPath", {}).get("path") == "/models", "the inference pod mounts the host's /models")

with open(os.path.join(deploy, "Dockerfile")) as f:
    dockerfile = f.read()
check(re.search(r"^FROM debian:12", dockerfile, re.M) is not None, "the image is Debian 12 based")
check("apt-get install" in dockerfile and "ckptfs_*.deb" in dockerfile, "the image installs the project's .deb")
for script in ("ckptfs-entrypoint", "ckptfs-metrics"):
    path = os.path.join(deploy, script)
    check(os.access(path, os.X_OK), script + " is executable")
    check(subprocess.run(["sh", "-n", path]).returncode == 0, script + " parses (sh -n)")
    check(script in dockerfile, "the image installs " + script)

if kubernetes_validate is None:
    print("kubernetes-validate not installed: schema validation skipped; field checks ran")
else:
    for name in ("namespace.yaml", "daemonset.yaml", "inference-pod.yaml"):
        for doc in load(name):
            try:
                kubernetes_validate.validate(doc, "1.30", strict=True)
            except Exception as e:  # the library raises several types
                failures.append("%s: %s is not valid Kubernetes 1.30: %s" % (name, doc.get("kind"), e))
    # The validator does catch a misspelt field.
    broken = copy.deepcopy(ds)
    broken["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["mountPropogation"] = "Bidirectional"
    try:
        kubernetes_validate.validate(broken, "1.30", strict=True)
        failures.append("kubernetes-validate accepted an unknown field")
    except Exception:
        pass
    print("validated against the Kubernetes 1.30 schema (strict)")

for f in failures:
    print("FAIL:", f)
print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
