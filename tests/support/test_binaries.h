// The binaries under test, as the build names them (the mount, security and
// robustness test executables are compiled with CKPTFS_PATH and
// CKPTFSCTL_PATH), and the size unit the tests write files in.
// CKPTFS_TEST_DAEMON and CKPTFS_TEST_CTL point the tests at another build
// (to show that a test fails on an older daemon).
#pragma once

#include <cstddef>
#include <cstdlib>
#include <string>

namespace ckptfs::testing {

inline std::string BinaryFromEnv(const char* name, const char* built) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' ? v : built;
}

inline const std::string kDaemon = BinaryFromEnv("CKPTFS_TEST_DAEMON", CKPTFS_PATH);
inline const std::string kCtl = BinaryFromEnv("CKPTFS_TEST_CTL", CKPTFSCTL_PATH);
inline constexpr size_t kMiB = size_t{1} << 20;

}  // namespace ckptfs::testing
