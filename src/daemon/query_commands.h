// The control-socket queries about the mount as a whole: status and ls.
// Each caller is answered only about the checkpoints it may see (see
// query_filter.h); the caller passes those states in.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckptfs/catalog_watcher.h"
#include "ckptfs/fuse_ops.h"
#include "mount_options.h"
#include "ckptfs/view.h"

namespace ckptfs::daemon {

// What `status` reports about the mount besides its checkpoints.
struct MountFacts {
  const MountOptions* options;  // canonical source and mount point
  std::string state_dir;
  std::string index_path;
  std::string log_destination;
};

// `node_counters`: with the counters of the whole node (reads, the last
// scan's totals, opens), which tell of every user's files: for root and
// the mount's owner only (as in stats).
nlohmann::json StatusJson(const std::vector<CheckpointState>& visible, const CatalogWatcher& watcher,
                          const MountFacts& mount, const fuse::FsContext& ctx, bool node_counters);

// One row per digest directory: its by-name paths and sources, from the
// checkpoint states the caller may see.
nlohmann::json LsJson(const std::vector<CheckpointState>& visible, const View& view, const std::string& source);

}  // namespace ckptfs::daemon
