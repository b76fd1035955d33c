"""What the plugin needs to know about a model path: is it a checkpoint on a
ckptfs mount, and if so which digest and by-name paths."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional

from .. import by_name as by_name_of
from ..errors import CkptfsError, NotACheckpointError, NotOnCkptfsError
from ..mount import checkpoint_dir, locate


@dataclass(frozen=True)
class MountedCheckpoint:
    model: str        # the path vLLM was given
    digest: str       # sha256-<hex>
    digest_path: str  # MOUNTPOINT/sha256-<hex>
    mountpoint: str
    given_by_name: Optional[str]  # "by-name/..." when the path given is one

    def by_name(self) -> List[str]:
        """The by-name paths of this digest: the one given, else the daemon's list."""
        if self.given_by_name is not None:
            return [self.given_by_name]
        try:
            return by_name_of(self.digest_path)
        except CkptfsError:
            return []


def mounted_checkpoint(model: object) -> Optional[MountedCheckpoint]:
    """The checkpoint `model` names when it is a directory on a ckptfs
    mount; None for anything else (a hub id, a directory elsewhere, a
    directory on the mount that is no checkpoint). Other errors (the mount
    is there but its attributes cannot be read) are raised: falling back to
    a key of names and headers there would bring back the bug the key fixes.
    """
    if not isinstance(model, str) or not os.path.isdir(model):
        return None
    try:
        where = locate(model)
        name, _ = checkpoint_dir(where)
    except (NotOnCkptfsError, NotACheckpointError):
        return None
    given = os.path.abspath(model)
    rel_given = given[len(where.mountpoint):].lstrip("/") if given.startswith(where.mountpoint + "/") else None
    given_by_name = rel_given if rel_given and rel_given.startswith("by-name/") else None
    return MountedCheckpoint(model, name, os.path.join(where.mountpoint, name), where.mountpoint, given_by_name)
