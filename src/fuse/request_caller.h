// The user behind a FUSE request, for the access rule of DESIGN.md section 2
// (see ckptfs/ownership.h for why the daemon checks it, not the kernel).
#pragma once

#include "ckptfs/fuse_ops.h"
#include "ckptfs/ownership.h"

namespace ckptfs::fuse {

// uid and gid from fuse_req_ctx; supplementary groups from
// fuse_req_getgroups, read only if a decision needs them.
Caller CallerOf(fuse_req_t req);

}  // namespace ckptfs::fuse
