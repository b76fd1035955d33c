#include "mount_point_checks.h"

#include <sys/stat.h>

#include <cerrno>

#include "ckptfs/mount_table.h"

namespace ckptfs::daemon {

Status CheckSourceOutsideMount(const std::string& source, const std::string& real_source,
                               const std::string& real_mountpoint) {
  struct stat mnt {};
  if (::stat(real_mountpoint.c_str(), &mnt) != 0) return Status::FromErrno("mount point " + real_mountpoint, errno);
  // Canonical: "/" or "/a/b", so each prefix ending before a '/' is an
  // ancestor, and "/" the last one.
  for (std::string dir = real_source;;) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0 && st.st_dev == mnt.st_dev && st.st_ino == mnt.st_ino) {
      const std::string how = dir == real_mountpoint ? std::string() : " (through " + dir + ", which is " +
                                                                           real_mountpoint + " by a bind mount)";
      const std::string named = source == real_source ? source : source + " (" + real_source + ")";
      return Status::Error("source " + named + " lies below the mount point " + real_mountpoint + how +
                           ": once mounted, every read of the source would come back to the mount itself and "
                           "hang; choose a source outside " + real_mountpoint);
    }
    if (dir == "/") return Status::Ok();
    const size_t slash = dir.rfind('/');
    dir = slash == 0 ? "/" : dir.substr(0, slash);
  }
}

Status CheckNoCkptfsMountAt(const std::string& real_mountpoint) {
  auto mount = MountAt(real_mountpoint);
  if (!mount || mount->fstype != kCkptfsMountType) return Status::Ok();
  return Status::Error("mount point " + real_mountpoint + " already holds a ckptfs mount (of " + mount->source +
                       "); a second one there would take over its control socket and pin list: unmount it first "
                       "(fusermount3 -u " + real_mountpoint + ") or choose another mount point");
}

}  // namespace ckptfs::daemon
