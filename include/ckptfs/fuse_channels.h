// Per-thread channels of a supervised FUSE connection.
//
// A daemon without a supervisor lets libfuse clone /dev/fuse once per worker
// thread (`clone_fd`): each thread then blocks in read() on a descriptor of
// its own, and the kernel wakes one reader per request. A supervised daemon
// cannot own its clones: at its death the kernel would fail every request
// read from them with ECONNABORTED instead of leaving them for the
// successor's FUSE_NOTIFY_RESEND. So the supervisor makes the clones and
// keeps them open for the life of the mount; each daemon inherits them and
// reads from them, and a daemon that dies leaves its requests queued on
// descriptors that are still open, which the resend puts back (it covers
// every clone of the connection). Under systemd they go to its fd store
// with the connection, so that a supervisor that dies leaves them open too.
#pragma once

#include <vector>

#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs::supervisor {

// `count` clones of the mounted /dev/fuse descriptor `fd`
// (FUSE_DEV_IOC_CLONE), blocking, close-on-exec.
Result<std::vector<UniqueFd>> CloneFuseChannels(int fd, unsigned count);

}  // namespace ckptfs::supervisor
