"""The Python client of a ckptfs mount.

    import ckptfs
    path = ckptfs.resolve("/models/by-name/llama-3-8b-ft")   # /models/sha256-<hex>
    ckptfs.digest(path)                                      # "sha256-<hex>"
    ckptfs.preload(path, pin=True)                           # root or the mount's owner
    ckptfs.stats(path)["checkpoints"]

Every function takes any path on a mount (a digest directory, a by-name link
or directory, a file) and raises a CkptfsError subclass naming the path and
the cause. Standard library only.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from . import control
from .control import ProgressCallback
from .errors import (CkptfsError, NotACheckpointError, NotOnCkptfsError, PathLike, ProtocolError,
                     RefusedError)
from .mount import MountPath, checkpoint_dir, locate

__all__ = [
    "CkptfsError", "NotACheckpointError", "NotOnCkptfsError", "ProtocolError", "RefusedError",
    "MountPath", "by_name", "digest", "is_on_ckptfs", "locate", "preload", "resolve", "stats",
]
__version__ = "0.1.0"


def is_on_ckptfs(path: PathLike) -> bool:
    """Whether `path` exists on a ckptfs mount this process trusts (see locate)."""
    try:
        locate(path)
    except CkptfsError:
        return False
    return True


def resolve(path: PathLike) -> str:
    """The digest path behind `path`, as `ckptfsctl resolve` prints it.

    A by-name link, or a by-name directory of a checkpoint that holds nested
    ones, gives MOUNTPOINT/sha256-<hex>; a path inside a digest directory
    gives itself with every link resolved. Give engines this path.
    """
    where = locate(path)
    if where.top.startswith("sha256-"):
        return where.real
    name, _ = checkpoint_dir(where)
    return os.path.join(where.mountpoint, name)


def digest(path: PathLike) -> str:
    """The digest ("sha256-<hex>") of the checkpoint `path` names or lies in,
    read from the mount's user.ckptfs.digest attribute."""
    name, _ = checkpoint_dir(locate(path))
    return name


def preload(path: PathLike, pin: bool = False, *, tier: str = "host",
            on_progress: Optional[ProgressCallback] = None, timeout: float = 600.0) -> Dict[str, Any]:
    """Copies every file of `path` into the mount's host tier (and pins it
    when `pin`), as `ckptfsctl preload [--pin]`; returns the daemon's reply
    ({"ok", "bytes", "files", "tier", "pinned"}). For root and the mount's
    owner; anyone else gets RefusedError. `on_progress(done, total)` is
    called with bytes while it works; `timeout` bounds each wait for a line.
    """
    where = locate(path)
    request = {"cmd": "preload", "path": where.rel, "tier": tier, "pin": bool(pin)}
    return control.call(where.mountpoint, request, about=where.path, on_progress=on_progress, timeout=timeout)


def stats(path: PathLike, *, timeout: float = 60.0) -> Dict[str, Any]:
    """The mount's cache statistics (`ckptfsctl stats --json`, paths
    decoded); below the mount point, "checkpoints" holds only the rows at or
    below `path`."""
    where = locate(path)
    reply = control.call(where.mountpoint, {"cmd": "stats"}, about=where.path, timeout=timeout)
    reply["checkpoints"] = control.rows_under(reply.get("checkpoints", []), where.rel)
    return reply


def by_name(path: PathLike, *, timeout: float = 60.0) -> List[str]:
    """The by-name paths (relative to the mount point, "by-name/...") that
    lead to the checkpoint `path` names, among those this user may see."""
    where = locate(path)
    name, _ = checkpoint_dir(where)
    reply = control.call(where.mountpoint, {"cmd": "ls"}, about=where.path, timeout=timeout)
    for row in reply.get("checkpoints", []):
        if row.get("name") == name:
            return [p for p in row.get("by_name", []) if isinstance(p, str)]
    return []
