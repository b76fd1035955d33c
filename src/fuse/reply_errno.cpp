#include "reply_errno.h"

#include <cerrno>

namespace ckptfs::fuse {

int ReplyErrno(const Status& s) {
  switch (s.error_number()) {
    case ENOMEM:
    case ETIMEDOUT:  // an NFS or sshfs source whose server is away
    case ESTALE:
      return s.error_number();
    default:
      return EIO;
  }
}

}  // namespace ckptfs::fuse
