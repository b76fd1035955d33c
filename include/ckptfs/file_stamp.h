// The identity of one version of a file as the kernel reports it. The index
// trusts a stored hash only while the file's stamp is unchanged; any write,
// truncate, replace or touch changes at least one field (ctime moves on every
// inode change, and user space cannot set it back).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>

namespace ckptfs {

struct FileStamp {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;

  static FileStamp FromStat(const struct stat& st);
  bool operator==(const FileStamp&) const = default;
  // "dev=.. ino=.. size=.. mtime=.. ctime=.." for log lines.
  std::string ToString() const;
};

}  // namespace ckptfs
