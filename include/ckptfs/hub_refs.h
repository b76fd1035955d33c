// Hugging Face hub caches (DESIGN.md section 2). A hub repository directory
// (models--org--name, datasets--..., spaces--...) holds blobs/, snapshots/
// and refs/, where refs/<revision> is a small file holding a commit hash. An
// offline hub client resolves a revision by reading refs/<revision> and then
// entering snapshots/<commit>; the view mirrors the refs files under by-name
// so that this works through the mount. They are not checkpoint members and
// never change a digest.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "ckptfs/file_stamp.h"
#include "ckptfs/ownership.h"
#include "ckptfs/status.h"

namespace ckptfs {

// A ref is a commit hash (40 hex) or, in newer caches, a short text; anything
// longer is not a ref, and the view keeps refs in memory.
inline constexpr size_t kMaxHubRefBytes = 4096;
// A repository's cache holds a ref per branch, tag or pull request it was
// asked for: a few, rarely hundreds. More are left out with a warning, so
// that a SRC writer's directory of refs costs the daemon a bounded view.
inline constexpr size_t kMaxHubRefsPerRepository = 1024;

// One refs/ file of a hub repository directory, with its bytes.
struct HubRef {
  std::string rel_path;  // relative to the source root: "hub/models--org--name/refs/main"
  std::string repo_rel_path;  // its repository directory: "hub/models--org--name"
  std::string content;   // the file's bytes, read during the walk
  FileStamp stamp;       // of the file, as read
  Ownership owner;
  AccessPath access;     // how the file is reached in the source
};

// "models--org--name", "datasets--org--name", "spaces--org--name".
bool IsHubRepoDirName(std::string_view name);

// Reads the ref file at canonical `path` below canonical `root`, as every
// reader of SRC opens files (no symlink followed, beneath the root). Fails,
// naming the path and the cause, when it cannot be read or exceeds
// kMaxHubRefBytes.
Result<std::string> ReadHubRef(const std::string& root, const std::string& path);

}  // namespace ckptfs
