// What kind of filesystem the source lies on, and whether inotify can be
// trusted to report its changes.
//
// inotify reports only changes made through this kernel's own VFS. On a
// network or cluster filesystem (NFS, SMB, Ceph, Lustre, GPFS, ...) another
// client's write raises no event here, and on a FUSE filesystem (sshfs,
// GlusterFS, JuiceFS, s3fs, bindfs) neither does a change made behind the
// FUSE daemon's back, which is every change for a network one. There only
// the periodic rescan finds changes.
#pragma once

#include <string>

namespace ckptfs {

struct SourceFilesystem {
  std::string type;  // "ext4", "nfs4", "fuse.sshfs", "ceph", ... ("unknown" if neither source below says)
  bool inotify_complete = true;  // false: changes by other clients raise no inotify event
};

// From statfs(2)'s f_type (which classifies) and /proc/self/mountinfo (which
// names FUSE subtypes, "fuse.sshfs"): the mount that holds `path`.
SourceFilesystem DetectSourceFilesystem(const std::string& path);

// For statfs's f_type: the filesystem's name when inotify misses changes
// made elsewhere, else empty.
std::string RemoteFilesystemName(long f_type);

}  // namespace ckptfs
