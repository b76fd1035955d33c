// Opening a source file for reading, the one way every reader of SRC does it
// (the indexer's hasher and the cache's SourceReader).
//
// The catalog resolved every symlink when it walked the tree, so a member's
// path is canonical: a link met on it now was swapped in afterwards. The open
// therefore follows no symlink at all (RESOLVE_NO_SYMLINKS), and inside the
// source root it is made beneath a descriptor of the root (RESOLVE_BENEATH),
// so that nothing outside SRC can be reached whatever is renamed meanwhile.
// O_NONBLOCK keeps a FIFO swapped in from parking the caller in open(); the
// file type is then checked on the descriptor, and everything after the open
// uses that descriptor (fstat, pread), never the path again.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

struct OpenedSource {
  UniqueFd fd;
  struct stat st {};
};

// Opens canonical `path` read-only. `root` is the canonical source root;
// empty for a path that is not a catalog member (a file named on
// ckptfsctl's command line), which is opened as named, links included. kChanged: the path no longer
// leads to a regular file without a link (the tree changed since it was
// walked; rescan); kError: another failure, with its errno kept.
Result<OpenedSource> OpenSourceFile(const std::string& root, const std::string& path);
// The same beneath `root_fd`, an O_PATH descriptor of `root` that the caller
// opened once for many files (-1: open the root for this file only).
Result<OpenedSource> OpenSourceFile(const std::string& root, const std::string& path, int root_fd);

// Whether canonical `path`, walked as OpenSourceFile walks it, still leads to
// the file `st` describes (its device and inode). The walk opens nothing for
// reading (O_PATH). kChanged when it leads elsewhere or nowhere: the file
// was moved, or a directory on its path was (out of SRC, say).
Status CheckSourcePath(const std::string& root, const std::string& path, const struct stat& st);

// Reading a source around the page cache (O_DIRECT), for the readers that
// copy or hash a cold file once: its bytes then go from the disk straight
// to where they are wanted, and the page cache neither takes fresh memory
// for them nor pushes out what others use.

// What O_DIRECT reads need: buffer address and file offset aligned to this.
inline constexpr size_t kDirectReadAlignment = 4096;
// `fd` opened again with O_DIRECT (through /proc/self/fd, which names this
// very file whatever happened to its path since), and checked to be the
// file `st` describes; invalid when it cannot be (no /proc, O_DIRECT
// refused, out of descriptors: errno says which).
UniqueFd ReopenDirect(int fd, const struct stat& st);
// As much of [offset, offset + len) as one O_DIRECT read of `direct_fd`
// gives, into `dst` (aligned, with room for `len` rounded up to the
// alignment; past `len` it is zeroed); the caller reads the rest, if any,
// buffered. nullopt when the read could not be direct at all: a misaligned
// buffer, or a filesystem that refuses the read (EINVAL).
std::optional<size_t> ReadDirect(int direct_fd, uint64_t offset, uint8_t* dst, size_t len);
// The share of [offset, offset + len) in the page cache now, from 0 to 1,
// asked of the kernel without reading anything (cachestat, Linux 6.5+; a
// read with RWF_NOWAIT would start read-ahead of what is missing, and so
// read it twice). nullopt when the kernel cannot say.
std::optional<double> CachedShare(int fd, uint64_t offset, size_t len);

}  // namespace ckptfs
