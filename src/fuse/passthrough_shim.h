// FUSE passthrough (kernel 6.9+, protocol 7.40): an open is answered with a
// backing file, and the kernel then serves read, splice and mmap of that open
// file from the backing file's page cache without asking the daemon.
//
// libfuse gained an API for it in 3.17 (fuse_passthrough_open,
// FUSE_CAP_PASSTHROUGH). Debian 12 ships 3.14, which has none, so where the
// headers lack it this file speaks the kernel ABI itself, and it is the only
// file that does. What it relies on (include/uapi/linux/fuse.h, 7.40):
//
//   INIT      the reply must carry FUSE_INIT_EXT (bit 30 of flags),
//             FUSE_PASSTHROUGH (1ULL << 37, i.e. bit 5 of flags2) and
//             max_stack_depth = 1 (the backing memfd is on shmem, depth 0);
//             the kernel offers passthrough by setting the same bit in the
//             INIT request's flags2. libfuse 3.14 builds the reply itself and
//             knows neither field, so fuse_session_custom_io() is used to see
//             the request the kernel sends and to patch the reply libfuse
//             writes (64 bytes of fuse_init_out after the 16-byte header).
//             The negotiated minor stays libfuse's: the kernel only looks at
//             the flag and the depth.
//   ioctl     FUSE_DEV_IOC_BACKING_OPEN = _IOW(229, 1, struct fuse_backing_map
//             {int32 fd; uint32 flags; uint64 padding}) returns a backing id
//             (needs CAP_SYS_ADMIN in the initial user namespace);
//             FUSE_DEV_IOC_BACKING_CLOSE = _IOW(229, 2, uint32) drops it.
//   OPEN      the reply is struct fuse_open_out {uint64 fh; uint32
//             open_flags; int32 backing_id} with FOPEN_PASSTHROUGH (1 << 7).
//             A flag outside the kernel's passthrough mask (FOPEN_KEEP_CACHE
//             among them) makes the open fail with EIO; FOPEN_NOFLUSH is in it.
//
// clone_fd and custom io combine: libfuse 3.14 calls the custom read and
// writev with the descriptor of the channel at hand (`ch ? ch->fd :
// se->fd`), and clones channels from se->fd, which stays the /dev/fuse
// descriptor of the mount. The custom io has no splice hooks, so libfuse
// offers no splice to the kernel; ckptfs replies with iovecs anyway.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "ckptfs/sealed_copy.h"
#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

#if defined(FUSE_CAP_PASSTHROUGH) && FUSE_VERSION >= FUSE_MAKE_VERSION(3, 17)
#define CKPTFS_LIBFUSE_PASSTHROUGH 1
#else
#define CKPTFS_LIBFUSE_PASSTHROUGH 0
#endif

namespace ckptfs::daemon {

class KernelPassthrough : public std::enable_shared_from_this<KernelPassthrough> {
 public:
  enum class Mode { kPending, kOn, kOff };

  // `wanted`: false with passthrough=off (then every open takes the chunk path).
  explicit KernelPassthrough(bool wanted);

  // After fuse_session_mount: keeps a descriptor of the connection for the
  // ioctls and, without libfuse's API, installs the custom io that watches
  // INIT. The session's userdata must be the FsContext that points here.
  Status Attach(fuse_session* se);

  // From the init operation: asks libfuse (3.17+) for passthrough.
  void OnInit(fuse_conn_info* conn);

  Mode mode() const { return mode_.load(); }
  // Why the mode is what it is, for status and stats.
  std::string reason() const;
  // Turns passthrough off for the rest of the mount (a refused backing file).
  void Disable(const std::string& why);

  // A backing id for `fd` in the kernel, closed when the returned handle
  // dies. Fails (and turns passthrough off when the kernel refuses for good)
  // with the cause.
  Result<std::shared_ptr<CopyAttachment>> OpenBacking(fuse_req_t req, int fd);
  // Answers an open with passthrough to `backing` (from OpenBacking);
  // returns what the reply's send returned (-ENOENT: the open was interrupted).
  int ReplyOpen(fuse_req_t req, fuse_file_info* fi, const CopyAttachment& backing);

  // The custom io (only without libfuse's API).
  ssize_t Read(int fd, void* buf, size_t len);
  ssize_t Writev(int fd, struct iovec* iov, int count);

 private:
  void CloseBacking(int id) const;
  void Settle(Mode mode, const std::string& why);
  void ProbeBacking();

  const bool wanted_;
  UniqueFd dev_;  // a dup of the session's /dev/fuse descriptor
  std::atomic<Mode> mode_{Mode::kPending};
  mutable std::mutex mu_;
  std::string reason_;
  // INIT, as seen by the custom io (notifications from other threads go
  // through the same writev).
  std::atomic<bool> init_seen_{false};
  std::atomic<uint64_t> init_unique_{0};
  std::atomic<bool> ask_{false};  // the INIT reply is to ask for passthrough
  friend class KernelBacking;
};

// The daemon's effective capabilities include CAP_SYS_ADMIN (which the
// kernel requires, in the initial user namespace, for a backing file).
bool HaveCapSysAdmin();

}  // namespace ckptfs::daemon
