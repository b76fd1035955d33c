#include "ckptfs/status.h"

#include <cstring>

namespace ckptfs {

Status Status::FromErrno(const std::string& what, int err) {
  Status s = Status::Error(what + ": " + std::strerror(err));
  s.errno_ = err;
  return s;
}

}  // namespace ckptfs
