// OpenSourceFiles: the source files a SourceReader reads, kept open between
// chunks (as LevelDB's table cache keeps tables open), at most `capacity`
// of them, the least recently read closed first. Without it every 4 MiB
// chunk opened its file again: an O_PATH open of the root, an openat2 and
// an fstat, for the same file, thousands of times a shard.
//
// A descriptor is kept for a path and the stamp it was indexed under. It
// stays good while that file's stamp is unchanged, which the reader checks
// with fstat before and after every read: a file changed in place is caught
// there (and forgotten here), and one renamed or replaced in SRC meanwhile
// is still the file whose bytes were indexed (each chunk is checked against
// the index as always). A file deleted from SRC holds its space on the disk
// while it is kept: its next read finds its ctime moved and drops it, and
// one never read again is closed once `capacity` others have been. A
// descriptor for O_DIRECT reads is a second entry,
// opened with the flag set, so no thread ever changes the flags of a
// descriptor another thread reads through.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "ckptfs/file_stamp.h"
#include "ckptfs/mutex.h"
#include "source_file.h"
#include "ckptfs/status.h"
#include "ckptfs/unique_fd.h"

namespace ckptfs {

class OpenSourceFiles {
 public:
  static constexpr size_t kDefaultCapacity = 64;
  OpenSourceFiles(std::string root, size_t capacity = kDefaultCapacity)
      : root_(std::move(root)), capacity_(capacity) {}

  struct File {
    UniqueFd fd;
    struct stat st {};  // when opened
  };
  using FilePtr = std::shared_ptr<const File>;

  // `path` open for reading (with O_DIRECT when `direct`; kError with
  // EINVAL where the filesystem refuses it), from an earlier read if one
  // with `stamp` is kept, else opened now (OpenSourceFile) and kept.
  Result<FilePtr> Open(const std::string& path, const FileStamp& stamp, bool direct);
  // The descriptors of `path` are no good any more (its stamp moved).
  void Forget(const std::string& path);
  size_t size() const;

 private:
  struct Key {
    std::string path;
    bool direct;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return std::hash<std::string>()(k.path) ^ (k.direct ? 1 : 0); }
  };
  struct Entry {
    FilePtr file;
    FileStamp stamp;
    std::list<Key>::iterator in_lru;
  };

  const std::string root_;
  const size_t capacity_;
  mutable Mutex mu_;
  std::unordered_map<Key, Entry, KeyHash> open_ GUARDED_BY(mu_);
  std::list<Key> lru_ GUARDED_BY(mu_);  // most recently read first
};

}  // namespace ckptfs
