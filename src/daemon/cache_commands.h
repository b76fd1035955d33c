// The control-socket commands that work on the chunk cache: preload, unpin,
// evict and stats. Whether the caller may ask is the command table's
// business (daemon_commands.cpp): these handlers assume it was checked.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckptfs/control.h"
#include "ckptfs/fuse_ops.h"
#include "ckptfs/host_tier_fill.h"

namespace ckptfs::daemon {

nlohmann::json HandlePreload(fuse::FsContext& ctx, const ControlServer::Request& r);
nlohmann::json HandleUnpin(fuse::FsContext& ctx, const ControlServer::Request& r);
nlohmann::json HandleEvict(fuse::FsContext& ctx, const ControlServer::Request& r);
// `by_name`: the digests the caller may see, with their by-name paths
// (VisibleByName); only they get a per-checkpoint row. `index_fill`: the
// copies made as files were hashed (fill_on_index), or null.
// `node_counters`: with the node's counters (tiers, opens, fills), which
// tell of every user's files: for root and the mount's owner only.
nlohmann::json HandleStats(fuse::FsContext& ctx, const HostTierFill* index_fill,
                           const std::map<std::string, std::vector<std::string>>& by_name, bool node_counters);

}  // namespace ckptfs::daemon
