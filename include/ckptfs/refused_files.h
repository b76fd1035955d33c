// Files whose source was found changed or damaged while serving them. Once a
// read found that the bytes behind (SHA-256, stamp) are no longer the ones
// indexed, every later read of it fails at once with EIO instead of reading
// the source again: a reader looping over a changed file must not turn each
// of its reads into 4 MiB of source I/O, a log line and a rescan.
//
// Each entry keeps why it was refused, so that a later read's error names
// the cause (a source changed, a chunk that failed its check) rather than
// only that no copy is left.
//
// Keyed by the expected content, the stamp and the chunk table together: the
// same path with the same stamp but a new digest (re-indexed after bit rot)
// is another key, and so is the same digest with a new chunk table (a shared
// manifest record whose table was wrong, replaced by the node's own hash).
// The set holds each refused table, so its address stays unique while used
// as a key.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <memory>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ckptfs/file_stamp.h"
#include "ckptfs/hashes.h"
#include "ckptfs/mutex.h"

namespace ckptfs {

class RefusedFiles {
 public:
  explicit RefusedFiles(size_t capacity = 4096) : capacity_(capacity) {}

  // True if this is news (the caller reports it once); false if known.
  using ChunkTable = std::shared_ptr<const std::vector<ChunkHash>>;
  bool Add(const Sha256Digest& sha256, const FileStamp& stamp, const ChunkTable& chunks, std::string why);
  bool Contains(const Sha256Digest& sha256, const FileStamp& stamp, const std::vector<ChunkHash>* chunks) const;
  // Why the key was refused; nullopt if it was not (or no longer is).
  std::optional<std::string> Why(const Sha256Digest& sha256, const FileStamp& stamp,
                                 const std::vector<ChunkHash>* chunks) const;

 private:
  using Key = std::tuple<Sha256Digest, FileStamp, const std::vector<ChunkHash>*>;
  struct Less {
    bool operator()(const Key& a, const Key& b) const;
  };
  const size_t capacity_;
  // Read on every chunk fetch: while nothing was ever refused (the usual
  // case) Contains() takes no lock.
  std::atomic<bool> any_{false};
  mutable Mutex mu_;
  std::map<Key, std::string, Less> keys_ GUARDED_BY(mu_);  // -> why
  // Oldest first, to stay within capacity; holds each key's chunk table.
  std::deque<std::pair<Key, ChunkTable>> order_ GUARDED_BY(mu_);
};

}  // namespace ckptfs
