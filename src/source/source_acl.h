// The owner, mode and access ACL of a source inode, as the access rule of
// DESIGN.md section 2 needs them: the kernel counts POSIX ACLs when it
// decides who may reach a copy in SRC, so the view must count them too.
#pragma once

#include <sys/stat.h>

#include <string>

#include "ckptfs/ownership.h"

namespace ckptfs {

// `st` is the lstat of `path` (not a symlink: links are resolved first).
// Reads the access ACL through libacl only when the inode has one (most do
// not, and asking costs one getxattr). An ACL that exists but cannot be
// read fails closed: only the owner (and root) keep access, since who else
// the ACL lets in is unknown.
Ownership ReadOwnership(const std::string& path, const struct stat& st);

}  // namespace ckptfs
