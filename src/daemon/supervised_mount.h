// Mount option supervise=on (the default): the process that `mount` runs
// mounts, becomes the supervisor (src/supervisor/supervisor.h) and runs the
// serving daemon as its child. Daemonized, the process that `mount` waits for
// exits only once that daemon serves, with status 0, or 1 if it could not
// start; until then the daemon's log lines also reach standard error.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include "mount_options.h"
#include "daemon_log.h"

namespace ckptfs::daemon {

// Mounts `se` at o.mountpoint and supervises until the mount is gone; the
// exit status for main. `o` holds canonical paths; argv is the command line,
// passed on to the daemon with the paths replaced by them.
int RunSupervisor(fuse_session* se, const MountOptions& o, int argc, char** argv, DaemonLog& log);

// Points standard input, output and error at /dev/null, as fuse_daemonize
// does: a daemonized process must not hold its starter's terminal or pipe.
void DetachStandardStreams();

}  // namespace ckptfs::daemon
