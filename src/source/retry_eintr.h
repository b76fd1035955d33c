// RetryOnEintr: a system call made again while it fails with EINTR. The FUSE
// threads of a draining daemon are woken by a signal (connection_io.cpp);
// one that just took a request may get it late, and a source on a network
// or FUSE filesystem then fails the call it was in with EINTR, which must not
// read as "the source changed" or "no access".
#pragma once

#include <cerrno>

namespace ckptfs {

template <class Call>
auto RetryOnEintr(Call call) {
  decltype(call()) rc;
  do {
    rc = call();
  } while (rc < 0 && errno == EINTR);
  return rc;
}

}  // namespace ckptfs
