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

}  // namespace ckptfs
