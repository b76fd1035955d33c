// The binaries under test, as the build names them (the mount, security and
// robustness test executables are compiled with CKPTFS_PATH and
// CKPTFSCTL_PATH), and the size unit the tests write files in.
#pragma once

#include <cstddef>
#include <string>

namespace ckptfs::testing {

inline const std::string kDaemon = CKPTFS_PATH;
inline const std::string kCtl = CKPTFSCTL_PATH;
inline constexpr size_t kMiB = size_t{1} << 20;

}  // namespace ckptfs::testing
