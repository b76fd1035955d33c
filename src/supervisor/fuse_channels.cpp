#include "ckptfs/fuse_channels.h"

#include <fcntl.h>
#include <sys/ioctl.h>

#include <cerrno>
#include <cstdint>

namespace ckptfs::supervisor {

namespace {

// include/uapi/linux/fuse.h: FUSE_DEV_IOC_CLONE, _IOR(229, 0, uint32_t).
constexpr unsigned long kFuseDevIocClone = _IOR(229, 0, uint32_t);

}  // namespace

Result<std::vector<UniqueFd>> CloneFuseChannels(int fd, unsigned count) {
  std::vector<UniqueFd> clones;
  uint32_t master = static_cast<uint32_t>(fd);
  for (unsigned i = 0; i < count; ++i) {
    UniqueFd clone(::open("/dev/fuse", O_RDWR | O_CLOEXEC));
    if (!clone.valid()) return Status::FromErrno("cannot open /dev/fuse for a channel of the connection", errno);
    if (::ioctl(clone.get(), kFuseDevIocClone, &master) != 0) {
      return Status::FromErrno("cannot clone the FUSE connection (FUSE_DEV_IOC_CLONE)", errno);
    }
    clones.push_back(std::move(clone));
  }
  return clones;
}

}  // namespace ckptfs::supervisor
