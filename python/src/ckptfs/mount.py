"""Where a path lies on a ckptfs mount, and the attributes the mount publishes.

A path is on ckptfs when the filesystem that holds it (after every symbolic
link is resolved) is mounted with type `fuse.ckptfs` and its root carries
`user.ckptfs.control`. The type is checked, not only the attribute: anyone
may set `user.*` attributes on their own directories, and a directory that
merely claims a digest must not steer a cache keyed by it.
"""
from __future__ import annotations

import errno as errno_codes
import os
import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .errors import CkptfsError, NotACheckpointError, NotOnCkptfsError, PathLike

FSTYPE = "fuse.ckptfs"
XATTR_CONTROL = "user.ckptfs.control"
XATTR_DIGEST = "user.ckptfs.digest"
XATTR_SOURCES = "user.ckptfs.sources"
XATTR_SHA256 = "user.ckptfs.sha256"
_DIGEST_NAME = re.compile(r"sha256-[0-9a-f]{64}")
_MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class MountPath:
    """`path` resolved: the ckptfs mount point it is under and its path below it."""

    path: str  # as given
    real: str  # every link resolved
    mountpoint: str
    rel: str  # below the mount point, "" for the mount point itself

    @property
    def top(self) -> str:
        """The first component below the mount point ("" at the root)."""
        return self.rel.split("/", 1)[0]


def _unescape_mountinfo(field: str) -> str:
    # The kernel writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts() -> List[Tuple[str, str, str]]:
    """(mount point, filesystem type, super options) of this mount namespace, in mount order."""
    out: List[Tuple[str, str, str]] = []
    with open(_MOUNTINFO, "rb") as f:
        for raw in f:
            line = os.fsdecode(raw.rstrip(b"\n"))
            left, sep, right = line.partition(" - ")
            fields, tail = left.split(" "), right.split(" ")
            if not sep or len(fields) < 5 or len(tail) < 3:
                continue
            out.append((_unescape_mountinfo(fields[4]), tail[0], tail[2]))
    return out


def _is_under(path: str, directory: str) -> bool:
    return directory == "/" or path == directory or path.startswith(directory + "/")


def _mount_of(real: str) -> Tuple[str, str, str]:
    """The mount that holds `real`: the deepest mount point above it, the last mounted of equals."""
    best: Optional[Tuple[str, str, str]] = None
    for entry in _mounts():
        if _is_under(real, entry[0]) and (best is None or len(entry[0]) >= len(best[0])):
            best = entry
    if best is None:
        raise CkptfsError(real, f"no mount in {_MOUNTINFO} holds it")
    return best


def _mount_user(options: str) -> Optional[int]:
    for opt in options.split(","):
        if opt.startswith("user_id="):
            try:
                return int(opt[len("user_id="):])
            except ValueError:
                return None
    return None


def locate(path: PathLike) -> MountPath:
    """Resolves `path` to its ckptfs mount point and its path below it.

    Raises NotOnCkptfsError when the filesystem holding it is not ckptfs (or
    is a ckptfs mount of another unprivileged user, which this process does
    not trust to name digests), CkptfsError when it does not exist.
    """
    given = os.fsdecode(path)
    real = os.path.realpath(given)
    try:
        os.stat(real)
    except OSError as e:
        raise CkptfsError(given, e.strerror or str(e), e.errno) from None
    mountpoint, fstype, options = _mount_of(real)
    if fstype != FSTYPE:
        raise NotOnCkptfsError(given, f"on a {fstype} filesystem mounted at {mountpoint}, not on a ckptfs mount")
    owner = _mount_user(options)
    if owner is not None and owner not in (0, os.geteuid()):
        raise NotOnCkptfsError(given, f"the ckptfs mount at {mountpoint} was mounted by uid {owner}, "
                                      "neither root nor this user; its digests are not trusted")
    try:
        os.getxattr(mountpoint, XATTR_CONTROL)
    except OSError as e:
        raise NotOnCkptfsError(given, f"the ckptfs mount at {mountpoint} has no {XATTR_CONTROL} attribute "
                                      f"({e.strerror})") from None
    rel = real[len(mountpoint):].lstrip("/") if real != mountpoint else ""
    return MountPath(given, real, mountpoint, rel)


def read_xattr(path: str, name: str) -> Optional[str]:
    """The attribute's value, None when the entry has no such attribute."""
    try:
        return os.fsdecode(os.getxattr(path, name))
    except OSError as e:
        if e.errno in (errno_codes.ENODATA, errno_codes.ENOTSUP):
            return None
        raise CkptfsError(path, f"cannot read {name}: {e.strerror}", e.errno) from None


def checkpoint_dir(where: MountPath) -> Tuple[str, str]:
    """(digest name, directory carrying it) of the checkpoint `where` names.

    A digest directory or anything in one names that digest; a by-name
    directory of a checkpoint that holds nested ones names its own, in
    user.ckptfs.digest. Anything else raises NotACheckpointError.
    """
    if _DIGEST_NAME.fullmatch(where.top):
        directory = os.path.join(where.mountpoint, where.top)
    else:
        directory = where.real
    name = read_xattr(directory, XATTR_DIGEST)
    if name is None:
        subject = "is" if where.real == os.path.abspath(where.path) else f"leads to {where.real}, which is"
        raise NotACheckpointError(where.path, f"{subject} neither a checkpoint nor inside a digest directory "
                                              "(a by-name link or a by-name directory of a checkpoint resolves "
                                              "to MOUNTPOINT/sha256-<hex>)")
    if not _DIGEST_NAME.fullmatch(name):
        raise CkptfsError(directory, f"{XATTR_DIGEST} is {name!r}, not sha256-<64 hex digits>")
    if _DIGEST_NAME.fullmatch(where.top) and name != where.top:
        raise CkptfsError(directory, f"{XATTR_DIGEST} is {name}, which is not the directory's name")
    return name, directory
