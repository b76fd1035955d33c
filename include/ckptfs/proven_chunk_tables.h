// ProvenChunkTables: the SHA-256 chains (ChunkChain) of files whose whole
// SHA-256 this daemon checked itself, for files whose index rows carry none
// (rows written before the chain, and hashes taken from a manifest). A
// chain lets the chunk path check each chunk it reads as strongly as the
// file's SHA-256 would (verify=sha256, and auto for a copy a user may
// write); without one, a chunk could not be checked alone. So the first
// time such a file is read whole (a fill of its copy, or a pass that only
// checks it) its chain is taken in the same pass as its SHA-256, and kept
// here if that SHA-256 is the index's.
//
// Bounded by the number of chain entries held (32 bytes each); the least
// recently used chain goes first, and its file is proven again when next
// needed.
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
  using Table = std::shared_ptr<const ChunkChain>;

  explicit ProvenChunkTables(uint64_t max_chunks) : max_chunks_(max_chunks) {}

  Table Find(const Sha256Digest& file);
  // Only for a chain taken from bytes whose whole SHA-256 was `file`.
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
