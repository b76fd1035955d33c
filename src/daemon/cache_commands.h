// The control-socket commands that work on the chunk cache: preload, unpin,
// evict and stats.
#pragma once

#include <nlohmann/json.hpp>

#include "ckptfs/control.h"
#include "ckptfs/fuse_ops.h"

namespace ckptfs::daemon {

nlohmann::json HandlePreload(FsContext& ctx, const ControlServer::Request& r);
nlohmann::json HandleUnpin(FsContext& ctx, const ControlServer::Request& r);
nlohmann::json HandleEvict(FsContext& ctx, const ControlServer::Request& r);
nlohmann::json HandleStats(FsContext& ctx);

}  // namespace ckptfs::daemon
