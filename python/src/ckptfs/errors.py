"""Errors of the ckptfs client: each names the path it was about and why."""
from __future__ import annotations

import os
from typing import Optional, Union

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


class CkptfsError(Exception):
    """A request about `path` failed for `cause`.

    `errno` is set when the cause is an operating-system error.
    """

    def __init__(self, path: PathLike, cause: str, errno: Optional[int] = None) -> None:
        self.path = os.fsdecode(path)
        self.cause = cause
        self.errno = errno
        super().__init__(f"{self.path}: {cause}")


class NotOnCkptfsError(CkptfsError):
    """`path` does not lie on a ckptfs mount."""


class NotACheckpointError(CkptfsError):
    """`path` is on a ckptfs mount but is neither a checkpoint nor inside one."""


class RefusedError(CkptfsError):
    """The daemon answered the request with an error (its words are `cause`)."""


class ProtocolError(CkptfsError):
    """The control socket could not be reached or answered something malformed."""
