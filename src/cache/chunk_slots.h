// ChunkSlots: the chunk tier's memory, verified 4 MiB chunks in pinned host
// memory (HostMemory slots), where every read of the chunk path is served
// from. Private to the cache stage: ChunkCache is its one user.
//
// Eviction is a segmented LRU: a new chunk enters a probation segment; a
// second use promotes it to a protected segment (at most 80% of the tier);
// victims come from probation first. A large sequential scan (one pass over
// a checkpoint that does not fit) therefore churns only probation and leaves
// the chunks in repeated use alone, which plain LRU would flush; it needs no
// tuning, unlike ARC's ghost lists or LFU's decay.
//
// Filling is a transaction, as in CernVM-FS's cache managers, held by an
// RAII guard (ChunkClaim): Claim either finds the chunk (the guard is a
// reference to it) or hands this caller an empty slot to fill, which the
// guard publishes on Commit and gives back if dropped uncommitted.
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

#include "ckptfs/cache_tier.h"
#include "ckptfs/chunk_tier.h"
#include "host_memory.h"
#include "ckptfs/mutex.h"
#include "ckptfs/status.h"

namespace ckptfs {

class ChunkSlots {
 public:
  using Use = ChunkClaim::Use;

  struct Options {
    uint64_t capacity = 0;
  };

  explicit ChunkSlots(Options options);
  ~ChunkSlots();
  ChunkSlots(const ChunkSlots&) = delete;
  ChunkSlots& operator=(const ChunkSlots&) = delete;

  // The chunk present, or an empty slot to fill (see ChunkClaim); kFull
  // when no slot can be freed (every chunk pinned or in use).
  Result<ChunkClaim> Claim(const ChunkKey& key, size_t len, Use use) EXCLUDES(mu_);
  // The chunk when it is present now: no fill, no wait, no use counted; an
  // empty claim when it is not.
  ChunkClaim Peek(const ChunkKey& key) EXCLUDES(mu_);

  // Whether one more chunk may be pinned: pins leave room for reads.
  Status CheckPinRoom(const ChunkKey& key) const EXCLUDES(mu_);
  uint64_t Unpin(const Sha256Digest& file) EXCLUDES(mu_);
  // Drops every chunk of `file` not in use right now (pinned or not);
  // returns the bytes dropped.
  uint64_t Evict(const Sha256Digest& file) EXCLUDES(mu_);

  void AddResidency(const Sha256Digest& file, CacheTier::Residency& r) const EXCLUDES(mu_);
  void AddResidency(std::map<Sha256Digest, CacheTier::Residency>& out) const EXCLUDES(mu_);

  struct Counters {
    ChunkTierStats tier;
    uint64_t readahead_fills = 0, readahead_hits = 0, preload_fills = 0;
    bool memory_locked = true;
  };
  Counters Stats() const EXCLUDES(mu_);

 private:
  friend class ChunkClaim;
  using Entry = ChunkSlot;
  using Entries = std::map<ChunkKey, std::unique_ptr<Entry>>;
  // What a claim does as it commits, is dropped or pins (ChunkClaim).
  void Commit(Entry* e, Use use, bool from_source) EXCLUDES(mu_);
  void Abort(Entry* e) EXCLUDES(mu_);
  void Release(Entry* e) EXCLUDES(mu_);
  void Pin(Entry* e) EXCLUDES(mu_);
  uint8_t* TakeSlot() EXCLUDES(mu_);
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
