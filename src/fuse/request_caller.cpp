#include "request_caller.h"

#include <vector>

namespace ckptfs::fuse {

Caller CallerOf(fuse_req_t req) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  return Caller(ctx->uid, ctx->gid, [req]() {
    // The kernel does not send groups; libfuse reads them from
    // /proc/PID/task/TID/status. Start with a typical size, grow if needed.
    std::vector<gid_t> groups(64);
    for (;;) {
      const int n = fuse_req_getgroups(req, static_cast<int>(groups.size()), groups.data());
      if (n < 0) return std::vector<gid_t>{};  // unknown: decide as if in no extra group
      if (static_cast<size_t>(n) <= groups.size()) {
        groups.resize(static_cast<size_t>(n));
        return groups;
      }
      groups.resize(static_cast<size_t>(n));
    }
  });
}

}  // namespace ckptfs::fuse
