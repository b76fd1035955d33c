#include "ckptfs/ownership.h"

#include <initializer_list>

namespace ckptfs {

Ownership Intersect(const Ownership& a, const Ownership& b) {
  Ownership out;
  mode_t mode = a.mode & b.mode & 0777;
  out.uid = a.uid;
  if (a.uid != b.uid) {
    out.uid = 0;
    mode &= ~mode_t{0700};
  }
  out.gid = a.gid;
  if (a.gid != b.gid) {
    out.gid = 0;
    mode &= ~mode_t{0070};
  }
  out.mode = mode;
  return out;
}

Ownership TraversalOnly(const Ownership& dir) {
  mode_t mode = 0;
  for (mode_t shift : {6u, 3u, 0u}) {
    if (dir.mode & (mode_t{1} << shift)) mode |= mode_t{5} << shift;
  }
  return {dir.uid, dir.gid, mode};
}

}  // namespace ckptfs
