#include "request_caller.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <optional>
#include <vector>

namespace ckptfs::fuse {

namespace {

// A caller whose groups cannot be read: counted, and said once, with the
// cause and the cure, since it refuses access only silently otherwise.
void NoteGroupsUnknown(FsContext* fs, pid_t pid, int err) {
  if (fs == nullptr) return;
  fs->callers_without_groups.fetch_add(1, std::memory_order_relaxed);
  if (fs->callers_without_groups_logged.exchange(true)) return;
  if (pid == 0) {
    spdlog::warn("a request came from a process outside this daemon's PID namespace (pid 0 here), whose "
                 "supplementary groups the daemon cannot read: access that only such a group grants is refused "
                 "(ckptfsctl status counts these). Run the daemon in the PID namespace of its callers (Kubernetes: "
                 "hostPID: true; a container: --pid=host)");
  } else {
    spdlog::warn("cannot read the supplementary groups of pid {} from /proc ({}): access that only such a group "
                 "grants is refused (ckptfsctl status counts these)",
                 pid, std::strerror(err));
  }
}

}  // namespace

Caller CallerOf(fuse_req_t req) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  auto* fs = static_cast<FsContext*>(fuse_req_userdata(req));
  return Caller(ctx->uid, ctx->gid, [req, fs, pid = ctx->pid]() -> std::optional<std::vector<gid_t>> {
    // The kernel does not send groups; libfuse reads them from
    // /proc/PID/task/TID/status. A caller the daemon's PID namespace does
    // not hold comes as pid 0, whose groups nobody can read.
    if (pid == 0) {
      NoteGroupsUnknown(fs, pid, ENOENT);
      return std::nullopt;
    }
    // Start with a typical size, grow if needed.
    std::vector<gid_t> groups(64);
    for (;;) {
      const int n = fuse_req_getgroups(req, static_cast<int>(groups.size()), groups.data());
      if (n < 0) {
        NoteGroupsUnknown(fs, pid, -n);
        return std::nullopt;
      }
      if (static_cast<size_t>(n) <= groups.size()) {
        groups.resize(static_cast<size_t>(n));
        return groups;
      }
      groups.resize(static_cast<size_t>(n));
    }
  });
}

}  // namespace ckptfs::fuse
