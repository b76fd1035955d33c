// What a control query may tell its caller (DESIGN.md section 2 applied to
// ckptfsctl): `status` and `ls` answer each caller only about checkpoints
// that caller could see in SRC, and tell only root and the mount's owner
// what symlinks resolve to (resolving runs as the daemon).
#pragma once

#include <string>
#include <vector>

#include "ckptfs/catalog_watcher.h"
#include "ckptfs/control.h"

namespace ckptfs::daemon {

// A checkpoint is visible to a caller who can search every directory from
// SRC down to its parent and then either list that parent or enter the
// checkpoint itself; root and the mount's owner see everything.
bool VisibleTo(const CheckpointState& state, const ControlServer::Request& r);

// The states the caller may see, with reasons redacted for unprivileged
// callers.
std::vector<CheckpointState> VisibleStates(std::vector<CheckpointState> states, const ControlServer::Request& r);

}  // namespace ckptfs::daemon
