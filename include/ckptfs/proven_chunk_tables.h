// ProvenChunkTables: per-chunk SHA-256 tables of files whose whole SHA-256
// this daemon checked (verify=sha256). The index holds a file's SHA-256 and
// an XXH3-128 per 4 MiB chunk; XXH3 catches corruption but not forgery, and
// a single chunk cannot be checked against a whole file's SHA-256. So the
// first time a file is read whole (a fill of its copy, or a pass that only
// checks it) the SHA-256 of every chunk is taken from the very bytes whose
// whole SHA-256 then matched the index's, and kept here: from then on the
// chunk path checks each chunk it reads against it, as strongly as the
// file's SHA-256 itself would.
//
// Bounded by the number of chunks held (32 bytes each); the least recently
// used table goes first, and its file is proven again when next needed.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <vector>

#include "ckptfs/hashes.h"
#include "ckptfs/mutex.h"

namespace ckptfs {

class ProvenChunkTables {
 public:
  using Table = std::shared_ptr<const std::vector<Sha256Digest>>;

  explicit ProvenChunkTables(uint64_t max_chunks) : max_chunks_(max_chunks) {}

  Table Find(const Sha256Digest& file);
  // Only for a table made from bytes whose whole SHA-256 was `file`.
  void Put(const Sha256Digest& file, Table table);
  uint64_t tables() const;

 private:
  struct Entry {
    Table table;
    std::list<Sha256Digest>::iterator lru;
  };
  const uint64_t max_chunks_;
  mutable Mutex mu_;
  std::map<Sha256Digest, Entry> tables_ GUARDED_BY(mu_);
  std::list<Sha256Digest> lru_ GUARDED_BY(mu_);  // front: most recently used
  uint64_t chunks_ GUARDED_BY(mu_) = 0;
};

}  // namespace ckptfs
