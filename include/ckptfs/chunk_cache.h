// ChunkCache: verified 4 MiB chunks of source files, keyed by (file SHA-256,
// chunk index) so that checkpoints sharing a file share its cache entries.
//
// Two tiers. The host tier (HostMemory, pinned) serves reads. The optional GPU
// tier (DeviceMemory) receives chunks evicted from the host tier while it has
// room; a host miss that hits the GPU tier copies the chunk back.
//
// Eviction in the host tier is a segmented LRU: a new chunk enters a
// probation segment; a second use promotes it to a protected segment (at most
// 80% of the tier); victims come from probation first. A large sequential
// scan (one pass over a checkpoint that does not fit) therefore churns only
// probation and leaves the chunks in repeated use alone, which plain LRU would
// flush; it needs no tuning, unlike ARC's ghost lists or LFU's decay. The GPU
// tier is plain LRU: everything in it has already been demoted once.
//
// Fills are single-flight: concurrent readers of a missing chunk wait for one
// fill. A fill is the caller's function (the SourceReader's pread and checks);
// a chunk is published only when it returns Ok. Pinned chunks are never
// evicted; a pin that would leave too little room fails instead of evicting
// other pins.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ckptfs/device_memory.h"
#include "ckptfs/hashes.h"
#include "ckptfs/host_memory.h"
#include "ckptfs/status.h"

namespace ckptfs {

struct ChunkKey {
  Sha256Digest file{};
  uint32_t index = 0;
  bool operator==(const ChunkKey&) const = default;
};

enum class Tier { kHost, kGpu };

struct TierStats {
  uint64_t capacity = 0;
  // Bytes of memory held. In the host tier every chunk takes a whole 4 MiB
  // slot, even a file's short last chunk (or a small config file).
  uint64_t used = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t fills = 0;       // host: chunks read from the source; gpu: chunks demoted into it
  uint64_t evictions = 0;
  uint64_t pinned = 0;      // bytes
};

struct CacheStats {
  TierStats host;
  TierStats gpu;
  bool gpu_enabled = false;
  bool host_pinned_memory = true;  // false once the kernel refused to lock a slab
  uint64_t verification_failures = 0;
  uint64_t readahead_fills = 0;
  uint64_t readahead_hits = 0;  // chunks filled by read-ahead and then read
  uint64_t preload_fills = 0;   // chunks read from the source by Load (preload)
  uint64_t uncached_reads = 0;  // served from a private buffer: the tier was all pinned or in use
};

class ChunkCache {
 public:
  struct Options {
    uint64_t host_capacity = 1ull << 30;
    uint64_t gpu_capacity = 0;
    DeviceMemory* device = nullptr;  // null: no GPU tier
    bool cuda_host_memory = false;   // host slabs from cudaHostAlloc
  };
  // Fills `dst` with `len` verified bytes, or says why it could not.
  using FillFn = std::function<Status(uint8_t* dst, size_t len)>;

  // A read reference to a chunk in host memory; the chunk cannot be evicted
  // while a Ref to it lives.
  class Ref {
   public:
    Ref() = default;
    Ref(Ref&& o) noexcept;
    Ref& operator=(Ref&& o) noexcept;
    ~Ref();
    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }

   private:
    friend class ChunkCache;
    void Release();
    ChunkCache* cache_ = nullptr;
    void* entry_ = nullptr;
    std::unique_ptr<uint8_t[]> owned_;  // an uncached read
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
  };

  explicit ChunkCache(Options options);
  ~ChunkCache();
  ChunkCache(const ChunkCache&) = delete;
  ChunkCache& operator=(const ChunkCache&) = delete;

  // The chunk in host memory, filling it if needed. `readahead` marks a fill
  // made ahead of the reader (counted apart).
  Result<Ref> Get(const ChunkKey& key, size_t len, const FillFn& fill, bool readahead = false);

  // Loads the chunk into `tier` (if not there) and, with `pin`, keeps it.
  Status Load(const ChunkKey& key, size_t len, const FillFn& fill, Tier tier, bool pin);
  // Unpins every chunk of `file`; returns the bytes unpinned.
  uint64_t Unpin(const Sha256Digest& file);
  // Drops every chunk of `file` not in use right now (pinned or not); returns bytes dropped.
  uint64_t Evict(const Sha256Digest& file);

  struct Residency {
    uint64_t host = 0, gpu = 0, pinned = 0;
  };
  Residency ResidentBytes(const Sha256Digest& file) const;
  // Every file with chunks in the cache, in one pass (for stats).
  std::map<Sha256Digest, Residency> ResidencyByFile() const;
  CacheStats Stats() const;
  void CountVerificationFailure();

 private:
  struct Entry;
  struct KeyHash {
    size_t operator()(const ChunkKey& k) const;
  };

  uint8_t* TakeHostSlot(std::unique_lock<std::mutex>& lock);
  bool EvictOneHost(std::unique_lock<std::mutex>& lock);
  void DemoteToGpu(Entry* e);
  bool MakeGpuRoom(size_t len);
  void Touch(Entry* e);
  void Unlink(Entry* e);
  void Erase(Entry* e);
  void ReleaseRef(Entry* e);
  // Why a chunk is wanted: a reader's request counts as a hit or a miss;
  // read-ahead and preload fills are counted apart, and only a read-ahead
  // fill that a reader then uses is a read-ahead hit.
  enum class Use { kRead, kReadAhead, kPreload };
  Result<Entry*> Acquire(const ChunkKey& key, size_t len, const FillFn& fill, Use use,
                         std::unique_lock<std::mutex>& lock);

  Options options_;
  HostMemory host_;
  mutable std::mutex mu_;
  std::condition_variable filled_;
  std::unordered_map<ChunkKey, std::unique_ptr<Entry>, KeyHash> entries_;
  std::list<Entry*> probation_, protected_, gpu_lru_;
  uint64_t protected_bytes_ = 0;
  uint64_t host_used_ = 0, gpu_used_ = 0, host_pinned_ = 0, gpu_pinned_ = 0;
  CacheStats stats_;
};

}  // namespace ckptfs
