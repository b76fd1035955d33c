// The errno of a FUSE reply to a request that failed.
#pragma once

#include "ckptfs/status.h"

namespace ckptfs::fuse {

// The system's own errno where it says something true to a reader of the
// view: memory ran out, or a network source timed out or went stale. EIO
// for everything else: a source that changed or fails its checks (no
// errno), a bad sector, the errors of a path in SRC (ENOENT, EACCES,
// ENOTDIR, ELOOP from the daemon's own walk there would tell the reader
// something false about a file it has open in the view), and the daemon's
// own limits (EMFILE would tell the reader that it is out of descriptors,
// ENOSPC that its disk is full).
int ReplyErrno(const Status& s);

}  // namespace ckptfs::fuse
