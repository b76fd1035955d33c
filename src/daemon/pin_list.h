// PinList: what `ckptfsctl preload --pin` pinned on a mount, kept in the
// state directory (pins-<hash of the mount point>.json), so that a daemon
// that takes the mount over pins it again: its cache starts empty. The list
// lives as long as the mount: the first daemon of a mount starts it afresh.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckptfs/control.h"
#include "ckptfs/mutex.h"
#include "ckptfs/status.h"

namespace ckptfs::fuse {
struct FsContext;
}  // namespace ckptfs::fuse

namespace ckptfs::daemon {

class PinList {
 public:
  struct Pin {
    std::string path;  // as the preload request named it, relative to the mount
    std::string tier;  // host (a pin of the removed GPU chunk tier, "gpu", is refused when replayed)
  };

  PinList(const std::string& state_dir, const std::string& canonical_mountpoint);

  // What the list holds now (empty when there is none, or it cannot be read).
  std::vector<Pin> Load() const;
  // A new mount: forget what an earlier one pinned.
  void Clear();
  // Keeps the list in step with a control request and the daemon's reply:
  // a pinning preload adds its path; unpin and evict remove it and what lies
  // below it. Failures are logged: the pin itself stands.
  void Record(const ControlServer::Request& r, const nlohmann::json& reply);

  const std::string& path() const { return path_; }

 private:
  std::vector<Pin> ReadLocked() const REQUIRES(mu_);
  Status Save(const std::vector<Pin>& pins) const;

  const std::string path_;
  mutable Mutex mu_;  // serialises reads and rewrites of the file
};

// Pins again what `pins` lists (a preload --pin of each), logging what
// cannot be (a digest withdrawn meanwhile); gives up when `stop` turns true.
void RestorePins(fuse::FsContext& ctx, const PinList& pins, const std::atomic<bool>& stop);

}  // namespace ckptfs::daemon
