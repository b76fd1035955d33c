#include "passthrough_shim.h"

#include "ckptfs/fuse_ops.h"
#include "ckptfs/mutex.h"

#include <linux/capability.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

namespace ckptfs::fuse {

namespace {

// The kernel ABI, include/uapi/linux/fuse.h 7.40 (Debian 12's linux-libc-dev
// is 7.38 and has none of it). Offsets are those of the packed wire structs.
constexpr size_t kInHeaderSize = 40;        // struct fuse_in_header
constexpr size_t kOutHeaderSize = 16;       // struct fuse_out_header
constexpr size_t kInitInFlags = 12;         // fuse_init_in.flags
constexpr size_t kInitInFlags2 = 16;        // fuse_init_in.flags2
constexpr size_t kInitOutSize = 64;         // struct fuse_init_out
constexpr size_t kInitOutFlags = 12;        // fuse_init_out.flags
constexpr size_t kInitOutFlags2 = 32;       // fuse_init_out.flags2
constexpr size_t kInitOutStackDepth = 36;   // fuse_init_out.max_stack_depth
constexpr uint32_t kInitExt = 1u << 30;     // FUSE_INIT_EXT
constexpr uint32_t kWritebackCache = 1u << 16;  // FUSE_WRITEBACK_CACHE: passthrough excludes it
constexpr uint32_t kPassthroughFlags2 = 1u << (37 - 32);  // FUSE_PASSTHROUGH
constexpr uint32_t kMaxStackDepth = 1;      // the backing memfd (shmem) is at depth 0
constexpr uint32_t kFopenNoflush = 1u << 5;       // FOPEN_NOFLUSH
constexpr uint32_t kFopenPassthrough = 1u << 7;   // FOPEN_PASSTHROUGH

struct FuseBackingMap {  // struct fuse_backing_map
  int32_t fd;
  uint32_t flags;
  uint64_t padding;
};
struct FuseOpenOut {  // struct fuse_open_out
  uint64_t fh;
  uint32_t open_flags;
  int32_t backing_id;
};
static_assert(sizeof(FuseBackingMap) == 16 && sizeof(FuseOpenOut) == 16);
constexpr unsigned long kBackingOpen = _IOW(229, 1, FuseBackingMap);  // FUSE_DEV_IOC_BACKING_OPEN
constexpr unsigned long kBackingClose = _IOW(229, 2, uint32_t);       // FUSE_DEV_IOC_BACKING_CLOSE

uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void Store32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, sizeof v); }

}  // namespace

// The kernel's backing id for one copy; closing it lets the kernel drop the
// backing file once no open file uses it any more.
class KernelBacking : public CopyAttachment {
 public:
  KernelBacking(std::shared_ptr<const KernelPassthrough> owner, int id) : owner_(std::move(owner)), id_(id) {}
  ~KernelBacking() override { owner_->CloseBacking(id_); }
  int id() const { return id_; }

 private:
  const std::shared_ptr<const KernelPassthrough> owner_;
  const int id_;
};

bool HaveCapSysAdmin() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &header, data) != 0) return false;
  return (data[CAP_TO_INDEX(CAP_SYS_ADMIN)].effective & CAP_TO_MASK(CAP_SYS_ADMIN)) != 0;
}

KernelPassthrough::KernelPassthrough(bool wanted) : wanted_(wanted) {
  if (!wanted_) Settle(Mode::kOff, "passthrough=off");
}

std::string KernelPassthrough::reason() const {
  MutexLock lock(mu_);
  return reason_;
}

void KernelPassthrough::Settle(Mode mode, const std::string& why) {
  {
    MutexLock lock(mu_);
    if (mode_.load() == Mode::kOff) return;  // off stays off, with its first reason
    reason_ = why;
    mode_ = mode;
  }
  if (mode == Mode::kOn) spdlog::info("kernel passthrough on: {}", why);
  else spdlog::warn("kernel passthrough off, files are served by the verified chunk path: {}", why);
}

void KernelPassthrough::Disable(const std::string& why) { Settle(Mode::kOff, why); }

Status KernelPassthrough::Attach(int fd) {
  dev_.reset(::fcntl(fd, F_DUPFD_CLOEXEC, 3));
  if (!dev_.valid()) return Status::FromErrno("cannot duplicate the /dev/fuse descriptor", errno);
  return Status::Ok();
}

void KernelPassthrough::OnInit([[maybe_unused]] fuse_conn_info* conn) {
#if CKPTFS_LIBFUSE_PASSTHROUGH
  if (!wanted_) return;
  if (!fuse_get_feature_flag(conn, FUSE_CAP_PASSTHROUGH)) {
    Disable("the kernel did not offer passthrough at INIT (it needs Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH)");
  } else if (!HaveCapSysAdmin()) {
    Disable("the daemon lacks CAP_SYS_ADMIN, which the kernel requires for a backing file");
  } else {
    fuse_unset_feature_flag(conn, FUSE_CAP_WRITEBACK_CACHE);
    fuse_set_feature_flag(conn, FUSE_CAP_PASSTHROUGH);
    conn->max_backing_stack_depth = 0;  // memfds: the kernel is told max_stack_depth 1
  }
#endif
}

void KernelPassthrough::OnInitRequest([[maybe_unused]] const uint8_t* p, [[maybe_unused]] size_t n) {
#if !CKPTFS_LIBFUSE_PASSTHROUGH
  if (!wanted_ || n < kInHeaderSize + kInitInFlags2 + 4) return;
  const uint32_t flags = Load32(p + kInHeaderSize + kInitInFlags);
  const uint32_t flags2 = (flags & kInitExt) ? Load32(p + kInHeaderSize + kInitInFlags2) : 0;
  if (!(flags2 & kPassthroughFlags2)) {
    Disable("the kernel did not offer passthrough at INIT (it needs Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH)");
  } else if (!HaveCapSysAdmin()) {
    Disable("the daemon lacks CAP_SYS_ADMIN, which the kernel requires for a backing file");
  } else {
    ask_ = true;
  }
#endif
}

bool KernelPassthrough::PatchInitReply(std::vector<uint8_t>& reply) {
  if (!ask_.exchange(false) || reply.size() != kOutHeaderSize + kInitOutSize) return false;
  uint8_t* out = reply.data() + kOutHeaderSize;
  const uint32_t flags = Load32(out + kInitOutFlags);
  if (Load32(reply.data() + 4) != 0 || (flags & kWritebackCache)) {
    Disable("the INIT reply is an error or asks for the writeback cache, which passthrough excludes");
    return false;
  }
  Store32(out + kInitOutFlags, flags | kInitExt);
  Store32(out + kInitOutFlags2, Load32(out + kInitOutFlags2) | kPassthroughFlags2);
  Store32(out + kInitOutStackDepth, kMaxStackDepth);
  return true;
}

void KernelPassthrough::AfterInitReply(bool adopted) {
  if (mode() == Mode::kOff) return;
  ProbeBacking(adopted);
}

// Whether the kernel gives this daemon backing files: one BACKING_OPEN of an
// empty memfd, closed at once.
void KernelPassthrough::ProbeBacking(bool adopted) {
  UniqueFd probe(::memfd_create("ckptfs-probe", MFD_CLOEXEC));
  if (!probe.valid()) {
    Disable("memfd_create failed: " + std::string(std::strerror(errno)));
    return;
  }
  FuseBackingMap map{probe.get(), 0, 0};
  const int id = ::ioctl(dev_.get(), kBackingOpen, &map);
  if (id <= 0) {
    const int err = errno;
    Disable(std::string("the kernel refused a backing file (FUSE_DEV_IOC_BACKING_OPEN: ") + std::strerror(err) +
            (err == EPERM ? "; it needs CAP_SYS_ADMIN in the initial user namespace)" : ")"));
    return;
  }
  CloseBacking(id);
  probe_id_ = id;
  Settle(Mode::kOn, adopted ? "the kernel gives backing files on the adopted connection"
                            : "the kernel accepted passthrough at INIT and gives backing files");
}

// The kernel hands out backing ids from 1 upwards (cyclically), so a
// predecessor's ids lie below our first one, or just above it where an id
// was freed. Closing an id only drops the connection's table entry: a file
// opened with it keeps its own reference to the backing file.
void KernelPassthrough::CloseStaleBackings(const std::vector<int>& keep) const {
  constexpr int kMaxSweep = 1 << 20, kMissesAbove = 1024;
  const int probe_id = probe_id_.load();
  if (probe_id <= 0) return;  // passthrough never worked on this connection
  int closed = 0;
  for (int id = 1, misses = 0; id < kMaxSweep && (id < probe_id || misses < kMissesAbove); ++id) {
    if (std::find(keep.begin(), keep.end(), id) != keep.end()) continue;
    uint32_t raw = static_cast<uint32_t>(id);
    if (::ioctl(dev_.get(), kBackingClose, &raw) == 0) {
      ++closed;
      misses = 0;
    } else if (id > probe_id) {
      ++misses;
    }
  }
  if (closed > 0) spdlog::info("closed {} backing file id(s) left by the previous daemon", closed);
}

Result<std::shared_ptr<CopyAttachment>> KernelPassthrough::OpenBacking([[maybe_unused]] fuse_req_t req, int fd) {
  if (mode() == Mode::kOff) return Status::Error("passthrough is off: " + reason());
#if CKPTFS_LIBFUSE_PASSTHROUGH
  const int id = fuse_passthrough_open(req, fd);
  const int err = errno;
#else
  FuseBackingMap map{fd, 0, 0};
  const int id = ::ioctl(dev_.get(), kBackingOpen, &map);
  const int err = errno;
#endif
  if (id <= 0) {
    const std::string why = std::string("FUSE_DEV_IOC_BACKING_OPEN: ") + std::strerror(err);
    // No privilege or no passthrough on this connection will not change;
    // anything else (out of memory) concerns this open only.
    if (err == EPERM || err == EINVAL || err == ENOTTY) Disable("the kernel refused a backing file (" + why + ")");
    return Status::FromErrno("backing file", err);
  }
  if (mode() == Mode::kPending) Settle(Mode::kOn, "the kernel gives backing files");
  return std::shared_ptr<CopyAttachment>(std::make_shared<KernelBacking>(shared_from_this(), id));
}

int KernelPassthrough::BackingId(const CopyAttachment& backing) {
  return static_cast<const KernelBacking&>(backing).id();
}

std::shared_ptr<CopyAttachment> KernelPassthrough::AdoptBacking(int id) {
  return std::make_shared<KernelBacking>(shared_from_this(), id);
}

void KernelPassthrough::CloseBacking(int id) const {
  if (keep_backings_) return;
  uint32_t raw = static_cast<uint32_t>(id);
  if (::ioctl(dev_.get(), kBackingClose, &raw) != 0 && errno != ENODEV && errno != ENOTCONN) {
    spdlog::debug("FUSE_DEV_IOC_BACKING_CLOSE {}: {}", id, std::strerror(errno));
  }
}

int KernelPassthrough::ReplyOpen(fuse_req_t req, fuse_file_info* fi, const CopyAttachment& backing) {
  const int backing_id = static_cast<const KernelBacking&>(backing).id();
#if CKPTFS_LIBFUSE_PASSTHROUGH
  fi->backing_id = backing_id;
  fi->keep_cache = 0;
  fi->noflush = 1;
  return fuse_reply_open(req, fi);
#else
  FuseOpenOut out{};
  out.fh = fi->fh;
  out.open_flags = kFopenPassthrough | kFopenNoflush;
  out.backing_id = backing_id;
  return fuse_reply_buf(req, reinterpret_cast<const char*>(&out), sizeof out);
#endif
}

}  // namespace ckptfs::fuse
