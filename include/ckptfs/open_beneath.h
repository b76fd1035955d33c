// openat2(2) for paths that someone else may rewrite: every component is
// resolved beneath a directory descriptor (RESOLVE_BENEATH) and none may be
// a symlink (RESOLVE_NO_SYMLINKS), so a link or a `..` swapped in anywhere
// on the path fails the open (ELOOP, EXDEV) instead of leading outside.
// Used for the source (source_file.h) and the manifest store.
#pragma once

#include <sys/types.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

// The raw system call: a descriptor, or -1 with errno set.
int OpenAt2(int dirfd, const std::string& path, uint64_t flags, uint64_t resolve, mode_t mode = 0);

// The resolve flags of OpenBeneath.
uint64_t BeneathNoSymlinks();

// Opens `rel` (relative, '/'-separated) beneath `dirfd` with `flags`
// (O_CLOEXEC is added). The error keeps the errno; `what` names the path in it.
Result<UniqueFd> OpenBeneath(int dirfd, const std::string& rel, uint64_t flags, const std::string& what,
                             mode_t mode = 0);

// True for the errnos with which OpenBeneath refuses a path that a symlink
// or `..` would have led elsewhere.
inline bool IsEscapeErrno(int err) { return err == ELOOP || err == EXDEV; }

}  // namespace ckptfs
