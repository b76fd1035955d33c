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
//             knows neither field, so ConnectionIo (the session's custom io)
//             shows this class the request the kernel sends and lets it
//             patch the reply libfuse writes (64 bytes of fuse_init_out
//             after the 16-byte header).
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
// Takeover (a daemon that adopts a connection from a dead or draining one):
// the kernel negotiated passthrough with the first daemon, so the adopted
// INIT is not answered again; AfterInitReply(adopted) closes the backing ids
// the predecessor left in the connection (the kernel keeps them until
// unmount, and each pins a memfd; open files hold their own reference) and
// then probes, which settles the mode as the kernel has it. This daemon's
// bookkeeping starts empty: it closes only ids it opened itself.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckptfs/mutex.h"
#include "ckptfs/sealed_copy.h"
#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

#if defined(FUSE_CAP_PASSTHROUGH) && FUSE_VERSION >= FUSE_MAKE_VERSION(3, 17)
#define CKPTFS_LIBFUSE_PASSTHROUGH 1
#else
#define CKPTFS_LIBFUSE_PASSTHROUGH 0
#endif

namespace ckptfs::fuse {

class KernelPassthrough : public std::enable_shared_from_this<KernelPassthrough> {
 public:
  enum class Mode { kPending, kOn, kOff };

  // `wanted`: false with passthrough=off (then every open takes the chunk path).
  explicit KernelPassthrough(bool wanted);

  // Keeps a descriptor of the connection (`fd`) for the ioctls.
  Status Attach(int fd);

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

  // From ConnectionIo (only without libfuse's API): the INIT request the
  // kernel sent, and the reply to it, patched in place to ask for
  // passthrough; true if patched.
  void OnInitRequest(const uint8_t* msg, size_t len);
  bool PatchInitReply(std::vector<uint8_t>& reply);
  // The INIT reply reached the kernel (or, `adopted`, it had long ago).
  void AfterInitReply(bool adopted);

  // Hand-over: this daemon's backing ids stay open when it exits (the
  // successor serves the inodes that use them); `AdoptBacking` is the
  // successor's handle on one, closed like its own.
  void KeepBackingsOpen() { keep_backings_ = true; }
  static int BackingId(const CopyAttachment& backing);
  std::shared_ptr<CopyAttachment> AdoptBacking(int id);
  // After a takeover: closes the backing ids a predecessor left in the
  // connection (the kernel keeps them until unmount, each pinning a memfd;
  // open files hold their own reference), except those in `keep`.
  void CloseStaleBackings(const std::vector<int>& keep) const;

 private:
  void CloseBacking(int id) const;
  void Settle(Mode mode, const std::string& why);
  void ProbeBacking(bool adopted = false);

  const bool wanted_;
  UniqueFd dev_;  // a dup of the session's /dev/fuse descriptor
  std::atomic<Mode> mode_{Mode::kPending};
  mutable Mutex mu_;
  std::string reason_ GUARDED_BY(mu_);
  std::atomic<bool> ask_{false};            // the INIT reply is to ask for passthrough
  std::atomic<bool> keep_backings_{false};  // KeepBackingsOpen: a successor may inherit them
  std::atomic<int> probe_id_{0};            // the id the probe got: a predecessor's ids lie below it
  friend class KernelBacking;
};

// The daemon's effective capabilities include CAP_SYS_ADMIN (which the
// kernel requires, in the initial user namespace, for a backing file).
bool HaveCapSysAdmin();

}  // namespace ckptfs::fuse
