// GpuChunkTier: the chunk path's lower tier, in device memory (DeviceMemory:
// a CUDA device, or the simulated one for tests). It takes the chunks the
// host tier evicts and the chunks loaded into it on purpose (ckptfsctl
// preload --tier gpu), and gives a chunk back to the host tier on a host
// miss. Plain LRU: everything in it has been demoted once or was asked for.
//
// Locking: one mutex, for the bookkeeping only (entries, LRU, budget,
// counters). Device allocation, copies and frees run outside it, so a slow
// device never holds up another chunk's lookup, nor the host tier at all:
// - an insert reserves its bytes in the budget, allocates and copies with
//   no lock held, and only then makes the chunk visible; a second insert of
//   the same chunk waits for the first (single flight);
// - a chunk being copied out is marked busy: neither eviction nor Evict
//   frees device memory a copy is reading.
// Entries are ordered by (file, chunk), so Unpin and Evict of a file cost
// its own chunks, not the whole tier.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "ckptfs/chunk_tier.h"
#include "ckptfs/device_memory.h"
#include "ckptfs/status.h"

namespace ckptfs {

class GpuChunkTier {
 public:
  // `device` must outlive the tier.
  GpuChunkTier(DeviceMemory& device, uint64_t capacity);
  ~GpuChunkTier();
  GpuChunkTier(const GpuChunkTier&) = delete;
  GpuChunkTier& operator=(const GpuChunkTier&) = delete;

  // Where an inserted chunk's bytes come from, for the counters.
  enum class From { kHostChunk, kHostCopy };
  // Copies `len` verified bytes at `src` into the tier as `key` (pinned if
  // asked). Ok when it is there already (then pinned if asked, and made the
  // most recently used). kFull when the tier has no unpinned room or a pin
  // would exceed it; an error when the device refuses memory (the tier then
  // shrinks to what it holds: another process took the device's memory) or
  // the copy fails.
  Status Insert(const ChunkKey& key, const uint8_t* src, size_t len, bool pin, From from);
  // Ok when `key` is in the tier (pinned if asked, made most recently
  // used); kNotFound when it is not; kFull when a pin would exceed the tier.
  Status Touch(const ChunkKey& key, bool pin);
  // Copies `key` into `dst`; kNotFound when absent. Unless `keep`, the
  // device copy is dropped afterwards if it is not pinned (the chunk lives
  // in the host tier again).
  Status CopyOut(const ChunkKey& key, uint8_t* dst, size_t len, bool keep);
  // A reader's host miss that this tier could not serve either.
  void CountMiss();

  // Unpins every chunk of `file`; returns the bytes unpinned.
  uint64_t Unpin(const Sha256Digest& file);
  // Drops every chunk of `file` not being copied right now (pinned or not);
  // returns the bytes dropped.
  uint64_t Evict(const Sha256Digest& file);
  // Adds this tier's bytes of `file` (gpu, pinned) to `r`.
  void AddResidency(const Sha256Digest& file, ChunkResidency& r) const;
  void AddResidency(std::map<Sha256Digest, ChunkResidency>& out) const;
  TierStats Stats() const;

 private:
  struct Entry {
    void* device = nullptr;
    size_t len = 0;
    bool pinned = false;
    int busy = 0;  // copies out in flight
    std::list<ChunkKey>::iterator lru;
  };
  using Entries = std::map<ChunkKey, Entry>;

  Status PinLocked(Entry& e, bool pin);
  bool MakeRoomLocked(size_t len, std::vector<void*>& to_free);
  void RemoveLocked(Entries::iterator it, std::vector<void*>& to_free);
  void FreeAll(const std::vector<void*>& device_ptrs);
  Status Publish(const ChunkKey& key, void* p, size_t len, bool pin, From from, Status copied);

  DeviceMemory& device_;
  mutable std::mutex mu_;
  std::condition_variable inserted_;
  Entries entries_;
  std::list<ChunkKey> lru_;       // front: most recently used
  std::set<ChunkKey> inserting_;  // inserts in flight
  uint64_t capacity_;
  uint64_t used_ = 0;             // including inserts in flight
  uint64_t pinned_ = 0;
  TierStats stats_;
};

}  // namespace ckptfs
