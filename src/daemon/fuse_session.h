// The libfuse session of one mount, owned: created with ckptfs's options,
// mounted, served by the multithreaded loop, and on destruction unmounted
// and destroyed (with libfuse's signal handlers removed), whatever step the
// start reached.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckptfs/fuse_ops.h"
#include "mount_options.h"
#include "ckptfs/status.h"

namespace ckptfs::daemon {

class FuseSession {
 public:
  // `ctx` is the operations' userdata and must outlive the session.
  static Result<std::unique_ptr<FuseSession>> Create(const MountOptions& o, const char* argv0, fuse::FsContext* ctx);
  ~FuseSession();
  FuseSession(const FuseSession&) = delete;
  FuseSession& operator=(const FuseSession&) = delete;

  // Installs libfuse's signal handlers (INT, TERM, HUP end the loop) and
  // mounts at `mountpoint`.
  Status Mount(const std::string& mountpoint);
  // Serves requests on `max_threads` threads at most, each with its own
  // /dev/fuse descriptor, until unmounted or signalled; libfuse's result.
  // `clone_fd` false: every thread reads the session's own descriptor.
  int Loop(unsigned max_threads, bool clone_fd = true);
  // libfuse's signal handlers (INT, TERM, HUP end the loop) without
  // mounting: for a descriptor a supervisor mounted.
  bool InstallSignalHandlers();
  // Hands the session over (to the supervisor, which mounts and destroys
  // it); this object then owns nothing.
  fuse_session* Release();
  // Unmounts (if mounted) and removes the signal handlers; the destructor
  // also does this.
  void Unmount();

  // Tells the kernel to forget a name or an inode's cached attributes and data.
  void InvalidateEntry(InodeId parent, const std::string& name);
  void InvalidateInode(InodeId ino, off_t offset, off_t length);

  fuse_session* get() { return se_; }

 private:
  FuseSession() = default;

  // libfuse's arguments, kept as long as the session as its examples do.
  std::vector<std::string> argv_strings_;
  std::vector<char*> argv_;
  fuse_args args_{};
  fuse_session* se_ = nullptr;
  bool handlers_ = false;
  bool mounted_ = false;
};

}  // namespace ckptfs::daemon
