// Writes a file so that readers see either nothing or all of it, on local
// and network filesystems alike: a temporary name in the same directory,
// every byte written and fsync'ed, then renameat(2) over the final name and
// an fsync of the directory. Concurrent writers of the same name each rename
// a complete file; the last one wins.
//
// Everything is done relative to a directory descriptor, never by path: the
// store's writers may swap a directory of the path for a symlink at any
// moment, and a descriptor keeps pointing at the directory it was opened on.
#pragma once

#include <string>
#include <string_view>

#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

// `dir` is an open directory (named `dir_name` in messages); `name` a plain
// file name in it; the file gets `mode`. A symlink at `name` is replaced,
// never followed.
Status WriteFileAtomically(int dir, const std::string& dir_name, const std::string& name, std::string_view bytes,
                           unsigned mode);

// Creates the directory `name` (mode 0755) in `parent` unless it is there,
// and opens it, refusing anything but a real directory (a symlink, a file).
// `path` names it in messages.
Result<UniqueFd> MakeAndOpenDirectory(int parent, const std::string& name, const std::string& path);

}  // namespace ckptfs
