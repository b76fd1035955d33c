// Dropping the kernel's caches (`echo 2 > /proc/sys/vm/drop_caches`) reaches
// every test running beside the one that does it (ctest runs two at once):
// a test that counts the entries the kernel holds would see them forgotten
// under it. Each test that drops the caches holds this lock while it runs,
// so that no two of them overlap.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "test_tree.h"

namespace ckptfs::testing {

class KernelCachesLock {
 public:
  KernelCachesLock() : fd_(::open("/tmp/ckptfs-tests-kernel-caches.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~KernelCachesLock() {
    if (fd_ >= 0) ::close(fd_);  // lets go of the lock
  }
  KernelCachesLock(const KernelCachesLock&) = delete;
  KernelCachesLock& operator=(const KernelCachesLock&) = delete;

  // Unused dentries and inodes go, and with them the FORGETs of a mount.
  static void DropDentriesAndInodes() { RunCommand("sync; echo 2 > /proc/sys/vm/drop_caches"); }

 private:
  const int fd_;
};

}  // namespace ckptfs::testing
