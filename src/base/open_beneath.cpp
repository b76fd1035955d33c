#include "ckptfs/open_beneath.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace ckptfs {

int OpenAt2(int dirfd, const std::string& path, uint64_t flags, uint64_t resolve, mode_t mode) {
  open_how how{};
  how.flags = flags;
  how.mode = (flags & (O_CREAT | O_TMPFILE)) != 0 ? mode : 0;
  how.resolve = resolve;
  return static_cast<int>(::syscall(SYS_openat2, dirfd, path.c_str(), &how, sizeof how));
}

uint64_t BeneathNoSymlinks() { return RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS; }

Result<UniqueFd> OpenBeneath(int dirfd, const std::string& rel, uint64_t flags, const std::string& what,
                             mode_t mode) {
  // EAGAIN: a rename raced a `..` in the lookup; a few tries, not forever,
  // since whoever renames may be doing it on purpose.
  int fd = -1;
  for (int attempt = 0; attempt < 8; ++attempt) {
    fd = OpenAt2(dirfd, rel, flags | O_CLOEXEC, BeneathNoSymlinks(), mode);
    if (fd >= 0 || (errno != EINTR && errno != EAGAIN)) break;
  }
  if (fd < 0) {
    const int err = errno;
    if (IsEscapeErrno(err)) {
      return Status::FromErrno(what + ": a symlink or '..' stands on its path; refused", err);
    }
    return Status::FromErrno(what, err);
  }
  return UniqueFd(fd);
}

}  // namespace ckptfs
