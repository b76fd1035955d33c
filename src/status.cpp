#include "ckptfs/status.h"

#include <cstring>

namespace ckptfs {

Status Status::FromErrno(const std::string& what, int err) {
  return Status::Error(what + ": " + std::strerror(err));
}

}  // namespace ckptfs
