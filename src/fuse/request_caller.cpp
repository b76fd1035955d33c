#include "request_caller.h"

#include <unistd.h>

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <vector>

namespace ckptfs::fuse {

namespace {

// Why a caller's groups could not be read; a bit each in
// FsContext::groups_causes_logged.
enum GroupsCause : unsigned { kOutsideNamespace = 1, kForeignProc = 2, kUnreadable = 4 };

// Whether /proc shows this process's own PID namespace. The kernel numbers
// a request's pid as the namespace of the process that mounted (this one)
// does, and libfuse reads the caller's groups from /proc/PID: a /proc of
// another namespace (a daemon started with unshare --pid and the host's
// /proc) would give the groups of whichever process has that number there.
bool ProcShowsOwnPidNamespace() {
  static const bool matches = [] {
    char buf[32];
    const ssize_t n = ::readlink("/proc/self", buf, sizeof buf - 1);
    if (n <= 0) return false;
    buf[n] = '\0';
    return std::strtol(buf, nullptr, 10) == ::getpid();
  }();
  return matches;
}

// A caller whose groups cannot be read: counted, and each cause said once,
// with the cure, since it would otherwise only show as refusals.
void NoteGroupsUnknown(FsContext* fs, GroupsCause cause, pid_t pid) {
  if (fs == nullptr) return;
  fs->callers_without_groups.fetch_add(1, std::memory_order_relaxed);
  if ((fs->groups_causes_logged.fetch_or(cause) & cause) != 0) return;
  constexpr const char* kEffect =
      "so the daemon grants such callers only what every set of groups would grant (a group that the mode keeps "
      "out keeps them out too; ckptfsctl status counts these decisions)";
  switch (cause) {
    case kOutsideNamespace:
      spdlog::warn("a request came from a process outside this daemon's PID namespace (pid 0 here), whose "
                   "supplementary groups cannot be read, {}. Run the daemon in the PID namespace of its callers "
                   "(Kubernetes: hostPID: true; a container: --pid=host)",
                   kEffect);
      break;
    case kForeignProc:
      spdlog::warn("/proc is not of this daemon's PID namespace (/proc/self is not pid {}), so callers' "
                   "supplementary groups cannot be read from it, {}. Mount the /proc of the daemon's PID "
                   "namespace, or run the daemon in the host's",
                   ::getpid(), kEffect);
      break;
    case kUnreadable:
      spdlog::warn("cannot read the supplementary groups of pid {} from /proc/{}/task/{}/status, {}", pid, pid, pid,
                   kEffect);
      break;
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
      NoteGroupsUnknown(fs, kOutsideNamespace, pid);
      return std::nullopt;
    }
    if (!ProcShowsOwnPidNamespace()) {
      NoteGroupsUnknown(fs, kForeignProc, pid);
      return std::nullopt;
    }
    // Start with a typical size, grow if needed.
    std::vector<gid_t> groups(64);
    for (;;) {
      const int n = fuse_req_getgroups(req, static_cast<int>(groups.size()), groups.data());
      if (n < 0) {  // libfuse says only EIO, whatever the cause
        NoteGroupsUnknown(fs, kUnreadable, pid);
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
