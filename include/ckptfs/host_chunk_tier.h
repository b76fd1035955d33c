// HostChunkTier: the chunk path's upper tier, verified 4 MiB chunks in host
// memory (HostMemory slots, pinned), where every read of the chunk path is
// served from.
//
// Eviction is a segmented LRU: a new chunk enters a probation segment; a
// second use promotes it to a protected segment (at most 80% of the tier);
// victims come from probation first. A large sequential scan (one pass over
// a checkpoint that does not fit) therefore churns only probation and leaves
// the chunks in repeated use alone, which plain LRU would flush; it needs no
// tuning, unlike ARC's ghost lists or LFU's decay.
//
// Filling is a transaction, as in CernVM-FS's cache managers: Claim either
// finds the chunk (and takes a reference to it) or hands this caller an
// empty slot to fill; Commit publishes it, Abort gives the slot back.
// Concurrent claims of a chunk being filled wait for that one fill (single
// flight). Pinned chunks are never evicted.
//
// Locking: one mutex and one condition variable, for the index, the LRU
// segments, references, pins and counters. What takes time runs outside
// them: the fill itself, and growing HostMemory by a slab (HostMemory
// reserves the room under its own lock, then maps and mlocks the slab with
// no lock held). A hit therefore waits for no disk and no mmap. Entries are
// ordered by (file, chunk), so Unpin and Evict of a file cost its own
// chunks, not the whole tier.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>

#include "ckptfs/chunk_tier.h"
#include "ckptfs/host_memory.h"
#include "ckptfs/mutex.h"
#include "ckptfs/status.h"

namespace ckptfs {

class HostChunkTier {
 public:
  // Why a chunk is wanted: a reader's request counts as a hit or a miss;
  // read-ahead and preload fills are counted apart, and only a read-ahead
  // fill that a reader then uses is a read-ahead hit.
  enum class Use { kRead, kReadAhead, kPreload };

  struct Options {
    uint64_t capacity = 0;
  };

  struct Entry;
  // What Claim found: the chunk present (a reference taken: Release it), or
  // an empty slot for this caller to fill (then Commit or Abort).
  struct Claimed {
    Entry* entry = nullptr;
    uint8_t* slot = nullptr;
    bool present = false;
  };

  explicit HostChunkTier(Options options);
  ~HostChunkTier();
  HostChunkTier(const HostChunkTier&) = delete;
  HostChunkTier& operator=(const HostChunkTier&) = delete;

  // kFull when no slot can be freed (every chunk pinned or in use).
  Result<Claimed> Claim(const ChunkKey& key, size_t len, Use use);
  // Publishes a filled slot and takes a reference to it. `from_source`: the
  // bytes were read from the source (counted as a fill), not copied from
  // a resident whole-file copy.
  void Commit(Entry* e, Use use, bool from_source);
  void Abort(Entry* e);
  void Release(Entry* e);

  // Whether one more chunk may be pinned: pins leave room for reads.
  Status CheckPinRoom(const ChunkKey& key) const;
  void Pin(Entry* e);
  uint64_t Unpin(const Sha256Digest& file);
  // Drops every chunk of `file` not in use right now (pinned or not);
  // returns the bytes dropped.
  uint64_t Evict(const Sha256Digest& file);

  void AddResidency(const Sha256Digest& file, ChunkResidency& r) const;
  void AddResidency(std::map<Sha256Digest, ChunkResidency>& out) const;

  struct Counters {
    TierStats tier;
    uint64_t readahead_fills = 0, readahead_hits = 0, preload_fills = 0;
    bool memory_locked = true;
  };
  Counters Stats() const;

 private:
  using Entries = std::map<ChunkKey, std::unique_ptr<Entry>>;
  uint8_t* TakeSlot();
  uint8_t* TakeVictimLocked() REQUIRES(mu_);
  void CountHitLocked(Entry& e, Use use) REQUIRES(mu_);
  void Touch(Entry& e) REQUIRES(mu_);
  void Unlink(Entry& e) REQUIRES(mu_);
  void PushProbation(Entry& e) REQUIRES(mu_);

  const Options options_;
  HostMemory memory_;
  mutable Mutex mu_;
  CondVar filled_;
  Entries entries_ GUARDED_BY(mu_);
  std::list<Entry*> probation_ GUARDED_BY(mu_), protected_ GUARDED_BY(mu_);
  uint64_t protected_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t pinned_ GUARDED_BY(mu_) = 0;
  Counters counters_ GUARDED_BY(mu_);
};

}  // namespace ckptfs
