// What a control query may tell its caller (DESIGN.md section 2 applied to
// ckptfsctl): `status` and `ls` answer each caller only about checkpoints
// that caller could see in SRC, and tell only root and the mount's owner
// what symlinks resolve to (resolving runs as the daemon).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ckptfs/catalog_watcher.h"
#include "ckptfs/control.h"
#include "ckptfs/view.h"

namespace ckptfs::daemon {

// A checkpoint is visible to a caller who can list and search every
// directory from SRC down to its parent (so could learn its path) and enter
// the checkpoint itself (so could hash what it holds); root and the mount's
// owner see everything.
bool VisibleTo(const CheckpointState& state, const ControlServer::Request& r);

// The states the caller may see, with reasons redacted for unprivileged
// callers.
std::vector<CheckpointState> VisibleStates(std::vector<CheckpointState> states, const ControlServer::Request& r);

// Every digest exposed among `visible` (the caller's VisibleStates), with
// its by-name paths ("by-name/...") that mirror one of those sources: the
// rows `ls` and `stats` may show this caller. `source` is the canonical SRC.
std::map<std::string, std::vector<std::string>> VisibleByName(const std::vector<CheckpointState>& visible,
                                                              const View& view, const std::string& source);

}  // namespace ckptfs::daemon
