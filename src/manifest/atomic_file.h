// Writes a file so that readers see either nothing or all of it, on local
// and network filesystems alike: a temporary name in the same directory,
// every byte written and fsync'ed, then rename(2) over the final name and an
// fsync of the directory. Concurrent writers of the same name each rename a
// complete file; the last one wins.
#pragma once

#include <string>
#include <string_view>

#include "ckptfs/status.h"

namespace ckptfs {

// `dir` must exist; `name` is a plain file name in it; the file gets `mode`.
Status WriteFileAtomically(const std::string& dir, const std::string& name, std::string_view bytes, unsigned mode);

// Creates `path` (mode 0755) unless it is already a directory.
Status MakeDirectory(const std::string& path);

}  // namespace ckptfs
