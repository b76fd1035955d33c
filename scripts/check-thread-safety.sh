#!/usr/bin/env bash
# Clang's thread-safety analysis over every C++ source of the project (part
# of the CI test command: scripts/run-tests.sh). Configures ./build-tsa with
# clang++ and -Wthread-safety -Werror, then runs the compiler on each
# translation unit of its compile_commands.json with -fsyntax-only: the
# analysis is part of clang's semantic checks, so this is the whole check,
# without code generation or linking (a few minutes on 2 cores rather than
# a second build) on the sources under src/ that have locks to check (see
# below). What it checks: every field marked GUARDED_BY is read and
# written with its lock held, every function marked REQUIRES is called with
# its lock held, and none marked EXCLUDES with it (ckptfs/mutex.h,
# ckptfs/thread_annotations.h). Exits non-zero on any warning.
# Usage: scripts/check-thread-safety.sh [SOURCE...] (e.g. src/view/view.cpp:
# those translation units only).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang++ >/dev/null || { echo "check-thread-safety.sh: clang++ is missing (packaging/install-deps.sh installs it)" >&2; exit 1; }
cmake --preset thread-safety >/dev/null  # CMakePresets.json: clang++, -Wthread-safety, build-tsa/
# Sources generated at build time (none today) would be missing here.
python3 - "$(nproc)" "$@" <<'PY'
import json, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
jobs = int(sys.argv[1])
import glob, os, re
# The project's own sources: the daemon's and the tools' locks are there
# (the tests' few are the standard ones, and checking their sources would
# double the time). Of those, the ones the analysis has something to check
# in: a source that takes a lock or carries an annotation, or includes a
# header that declares guarded fields or annotated functions (a class's
# methods, and the callers of its REQUIRES/EXCLUDES functions, include its
# header). The others (about half) parse for nothing; CKPTFS_TSA_ALL=1
# checks them too.
entries = [e for e in json.load(open("build-tsa/compile_commands.json")) if "/src/" in e["file"]]
annotated = {os.path.basename(h) for h in glob.glob("include/ckptfs/*.h") + glob.glob("src/*/*.h")
             if re.search(r"\b(GUARDED_BY|PT_GUARDED_BY|REQUIRES|REQUIRES_SHARED|EXCLUDES)\(", open(h).read())}
uses = re.compile(r"\b(MutexLock|ReaderLock|WriterLock|CondVar|Mutex|SharedMutex|GUARDED_BY|REQUIRES|EXCLUDES)\b|"
                  r'#include "(?:ckptfs/)?(' + "|".join(re.escape(h) for h in sorted(annotated)) + r')"')
if os.environ.get("CKPTFS_TSA_ALL") != "1":
    entries = [e for e in entries if uses.search(open(e["file"]).read())]
# Sources named on the command line: only those (while working on one).
if len(sys.argv) > 2:
    wanted = [s.rstrip("/") for s in sys.argv[2:]]
    entries = [e for e in entries if any(e["file"].endswith("/" + w) for w in wanted)]
def check(e):
    args = shlex.split(e["command"])
    # -o and the object file go; -fsyntax-only does the semantic checks only.
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a in ("-MD",) or a.startswith("-MF") or a.startswith("-MT"):
            if a in ("-MF", "-MT"):
                skip = True
            continue
        out.append(a)
    r = subprocess.run(out + ["-fsyntax-only"], cwd=e["directory"], capture_output=True, text=True)
    return e["file"], r.returncode, r.stderr
failed = 0
with ThreadPoolExecutor(max_workers=jobs) as pool:
    for path, rc, err in pool.map(check, entries):
        if rc != 0 or err.strip():
            failed += 1
            sys.stderr.write(err)
print(f"check-thread-safety.sh: {len(entries)} translation units, {failed} with warnings")
sys.exit(1 if failed else 0)
PY
