// What is refused about SRC and MOUNTPOINT before anything is mounted
// (issue 21, items 10 and 11), apart from what Daemon::CheckPaths refuses
// by itself (paths that are not directories, MNT == SRC).
#pragma once

#include <string>

#include "ckptfs/status.h"

namespace ckptfs::daemon {

// SRC must not lie below MNT by any path: its canonical path under MNT's,
// a symlink that leads there (already resolved in `real_source`), or a bind
// mount of MNT or of a directory above SRC's. Checked by device and inode,
// directory by directory from SRC up to "/": once MNT is mounted, each
// read of SRC would come back to the mount and wait on itself.
// `source` is SRC as given (named in the message beside its canonical path).
Status CheckSourceOutsideMount(const std::string& source, const std::string& real_source,
                               const std::string& real_mountpoint);

// MNT must not already hold a ckptfs mount: the second would take the
// first's control socket and clear its pin list (both are named after the
// mount point), and stack on top of it.
Status CheckNoCkptfsMountAt(const std::string& real_mountpoint);

}  // namespace ckptfs::daemon
