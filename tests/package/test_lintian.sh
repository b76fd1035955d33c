#!/usr/bin/env bash
# The .deb as Debian's checker sees it: runs `lintian -EvIL +pedantic` on the
# package scripts/build-deb.sh put into DEB_DIR. Fails on any
# error or warning (overrides in the package count only with a reason, see
# packaging/debian/lintian-overrides), and on what lintian reports only as
# information but this project requires: hardening (fortify, bindnow, PIE,
# stack protector) and man pages compressed with `gzip -9n`. Also checks that
# the copyright file parses as machine-readable DEP-5 (lintian only checks
# that for source packages) and carries the license of each part linked in.
# Usage: test_lintian.sh DEB_DIR. Needs lintian and python3-debian
# (packaging/install-deps.sh installs both); does not install anything.
set -euo pipefail
debs_dir=$1
fail() { echo "FAIL: $*" >&2; exit 1; }

command -v lintian >/dev/null || fail "lintian is not installed (packaging/install-deps.sh installs it)"
# Debian's own python3, which python3-debian installs into (a python3 earlier
# in PATH, such as a pyenv shim, does not see it).
py=/usr/bin/python3
"$py" -c 'import debian.copyright' 2>/dev/null \
  || fail "$py cannot import debian.copyright: python3-debian is not installed (packaging/install-deps.sh installs it)"

work=$(mktemp -d /tmp/ckptfs-lintian.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir "$work/pkg"
debs=("$debs_dir"/ckptfs_*.deb)
[ -f "${debs[0]}" ] || fail "no ckptfs_*.deb in $debs_dir (scripts/build-deb.sh $debs_dir makes it)"
[ "${#debs[@]}" -eq 1 ] || fail "${#debs[@]} packages named ckptfs_*.deb in $debs_dir"
cp "${debs[0]}" "$work/pkg/"
deb="$work/pkg/$(basename "${debs[0]}")"
# dh_strip's debug symbols, in their own package, for the same build ids.
dbgsyms=("$debs_dir"/ckptfs-dbgsym_*.deb)
[ -f "${dbgsyms[0]}" ] || fail "no ckptfs-dbgsym_*.deb in $debs_dir"

# lintian refuses nothing as root but warns that it should not run as root;
# run it as nobody when we are root.
chmod 0755 "$work" "$work/pkg"
chmod 0644 "$deb"
as_user=()
if [ "$(id -u)" -eq 0 ]; then
  as_user=(setpriv --reuid=nobody --regid=nogroup --clear-groups env HOME="$work" TMPDIR=/tmp)
fi
set +e
"${as_user[@]}" lintian -EvIL +pedantic --fail-on error,warning "$deb" >"$work/lintian.txt" 2>&1
rc=$?
set -e
echo "lintian -EvIL +pedantic $(basename "$deb") (exit $rc):"
sed 's/^/  /' "$work/lintian.txt"
# Exit status 2 is lintian's verdict; anything else non-zero means it did not run.
[ "$rc" -eq 0 ] || [ "$rc" -eq 2 ] || fail "lintian itself failed (exit $rc) on $deb"
# Checked on the output as well as the status, so an override without a
# reason, or a lintian whose --fail-on means something else, cannot pass.
grep -E '^[EW]: ' "$work/lintian.txt" >/dev/null && fail "lintian reports errors or warnings (above) on $(basename "$deb")"
[ "$rc" -eq 0 ] || fail "lintian exited $rc on $(basename "$deb")"
grep -E '^I: [^ ]+ hardening-' "$work/lintian.txt" >/dev/null \
  && fail "lintian reports missing hardening (the I: hardening-* lines above)"

# What lintian does not check on a binary package.
root="$work/root"
mkdir "$root"
dpkg-deb -x "$deb" "$root"
# readelf output is held in variables: `readelf | grep -q` under pipefail
# fails whenever grep stops reading early, which would invert the checks.
for bin in usr/bin/ckptfs usr/bin/ckptfsctl; do
  [ -f "$root/$bin" ] || fail "the package has no /$bin"
  header=$(readelf -W -h "$root/$bin") dynamic=$(readelf -W -d "$root/$bin") segments=$(readelf -W -l "$root/$bin")
  sections=$(readelf -W -S "$root/$bin") symbols=$(readelf -W --dyn-syms "$root/$bin")
  grep -q 'Type:.*DYN' <<<"$header" || fail "/$bin is not a position-independent executable"
  grep -q 'BIND_NOW' <<<"$dynamic" || fail "/$bin is not linked with -z now"
  grep -q 'GNU_RELRO' <<<"$segments" || fail "/$bin is not linked with -z relro"
  grep -q '__stack_chk_fail' <<<"$symbols" || fail "/$bin has no stack protector"
  grep -q '_chk@' <<<"$symbols" || fail "/$bin calls no fortified (_chk) functions"
  ! grep -q -E '\.debug_|\.symtab' <<<"$sections" || fail "/$bin is not stripped"
done
dbgroot="$work/dbgsym"
mkdir "$dbgroot"
dpkg-deb -x "${dbgsyms[0]}" "$dbgroot"
for bin in usr/bin/ckptfs usr/bin/ckptfsctl; do
  id=$(readelf -W -n "$root/$bin" | sed -n 's/.*Build ID: \([0-9a-f]*\).*/\1/p')
  [ -n "$id" ] || fail "/$bin has no build id"
  [ -f "$dbgroot/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug" ] || fail "the dbgsym package has no symbols for /$bin"
done
mans=("$root"/usr/share/man/man8/*)
[ "${#mans[@]}" -ge 3 ] || fail "expected at least three man pages in /usr/share/man/man8, found ${#mans[@]}"
for man in "${mans[@]}"; do
  case $man in *.gz) ;; *) fail "${man#"$root"} is not compressed" ;; esac
  [ -L "$man" ] && continue
  # gzip header: byte 3 holds the flags (8 = file name stored), bytes 4-7
  # the time stamp, byte 8 is 2 for maximum compression.
  read -r -a header < <(od -A n -t u1 -N 9 "$man")
  [ "${header[3]}" -eq 0 ] && [ "${header[4]}${header[5]}${header[6]}${header[7]}" = 0000 ] \
    || fail "${man#"$root"} stores a name or a time stamp (compress it with gzip -9n)"
  [ "${header[8]}" -eq 2 ] || fail "${man#"$root"} is not compressed with gzip -9"
done
[ -e "$root/usr/share/man/man8/mount.ckptfs.8.gz" ] || fail "no mount.ckptfs(8) page in the package"
[ -f "$root/usr/share/doc/ckptfs/changelog.Debian.gz" ] || fail "no /usr/share/doc/ckptfs/changelog.Debian.gz"

# An override silences lintian: each one (or each block of consecutive ones)
# must follow a comment that says why.
overrides="$root/usr/share/lintian/overrides/ckptfs"
if [ -f "$overrides" ]; then
  commented=0
  while IFS= read -r line; do
    case $line in
      "#"*) commented=1 ;;
      "") commented=0 ;;
      *) [ "$commented" -eq 1 ] || fail "/usr/share/lintian/overrides/ckptfs: '$line' has no comment saying why" ;;
    esac
  done <"$overrides"
fi

copyright="$root/usr/share/doc/ckptfs/copyright"
[ -f "$copyright" ] || fail "no /usr/share/doc/ckptfs/copyright"
# The build links the CUDA runtime statically when it found a toolkit; the
# packaged binary says so in its version line.
version=$("$root/usr/bin/ckptfsctl" --version) || fail "the packaged ckptfsctl --version failed"
with_cuda=0
[[ "$version" == *"CUDA runtime"* ]] && with_cuda=1
"$py" - "$copyright" "$with_cuda" <<'EOF' || fail "/usr/share/doc/ckptfs/copyright is not complete DEP-5 (above)"
import re, sys
from debian.copyright import Copyright, MachineReadableFormatError, NotMachineReadableError
path, with_cuda = sys.argv[1], sys.argv[2] == "1"
with open(path, encoding="utf-8") as f:
    try:
        c = Copyright(f, strict=True)
    except (NotMachineReadableError, MachineReadableFormatError, ValueError) as e:
        sys.exit(f"{path}: not machine-readable DEP-5: {e}")
problems = []
defined = {p.license.synopsis for p in c.all_license_paragraphs()}
used = set()
for p in c.all_files_paragraphs():
    if not p.copyright:
        problems.append(f"Files: {' '.join(p.files)} has no Copyright")
    names = set(re.split(r"\s+(?:and|or)\s+", p.license.synopsis.strip()))
    used |= names
    if not p.license.text:
        for n in names - defined:
            problems.append(f"license {n} (Files: {' '.join(p.files)}) has no text")
for n in defined - used:
    problems.append(f"license paragraph {n} is used by no Files paragraph")
if "Expat" not in used:
    problems.append("the project's own license (Expat, see LICENSE) is not named")
if with_cuda and not any("NVIDIA" in n for n in used):
    problems.append("the binaries link the CUDA runtime statically but its license is not named")
for p in problems:
    print(f"{path}: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
echo "lintian test: $(basename "$deb") has no lintian errors or warnings, hardened and stripped binaries, gzip -9n man pages, a DEP-5 copyright file and a changelog"
