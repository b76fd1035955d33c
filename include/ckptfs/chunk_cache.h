// ChunkCache: the chunk path's cache of verified 4 MiB chunks of source
// files, keyed by (file SHA-256, chunk index) so that checkpoints sharing a
// file share its cache entries.
//
// A tiered cache, composed the way CernVM-FS composes cache managers: an
// upper tier that serves reads (HostChunkTier, pinned host memory) over an
// optional lower tier (GpuChunkTier, device memory). A read that misses the
// upper tier is filled from the lower tier if it holds the chunk, else by
// the caller's fill function (the SourceReader's pread and checks); chunks
// the upper tier evicts go down to the lower tier while it has room. Each
// tier has its own lock for its own job, and neither holds it over a fill,
// a device allocation or a device copy: a host hit never waits for the GPU.
//
// Loads (ckptfsctl preload) put a chunk into either tier, pinned if asked.
// When the file is resident whole in the host tier of files (FileCache: a
// sealed copy verified when it was filled), a load copies from that copy's
// mapping instead of reading the source again; with the GPU tier on, a
// pinned copy is registered with the device, so that copy is a DMA.
//
// Fills are single-flight (concurrent readers of a missing chunk wait for
// one fill), and a chunk is published only when its fill returned Ok.
// Pinned chunks are never evicted; a pin that would leave too little room
// fails instead of evicting other pins.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "ckptfs/chunk_tier.h"
#include "ckptfs/device_memory.h"
#include "ckptfs/file_cache.h"
#include "ckptfs/gpu_chunk_tier.h"
#include "ckptfs/hashes.h"
#include "ckptfs/host_chunk_tier.h"
#include "ckptfs/status.h"

namespace ckptfs {

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
    FileCache* files = nullptr;      // whole verified files that loads may copy from; may be null
  };
  // Fills `dst` with `len` verified bytes, or says why it could not.
  using FillFn = std::function<Status(uint8_t* dst, size_t len)>;
  using Residency = ChunkResidency;

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
    HostChunkTier* tier_ = nullptr;
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
  // Unpins every chunk of `file` in both tiers; returns the bytes unpinned.
  uint64_t Unpin(const Sha256Digest& file);
  // Drops every chunk of `file` not in use right now (pinned or not) from
  // both tiers; returns bytes dropped.
  uint64_t Evict(const Sha256Digest& file);

  // `pinned` counts a chunk pinned in both tiers once per tier.
  Residency ResidentBytes(const Sha256Digest& file) const;
  // Every file with chunks in the cache, in one pass (for stats).
  std::map<Sha256Digest, Residency> ResidencyByFile() const;
  CacheStats Stats() const;
  void CountVerificationFailure();

 private:
  using Use = HostChunkTier::Use;
  Status FillClaimed(const ChunkKey& key, const HostChunkTier::Claimed& claimed, size_t len, const FillFn& fill,
                     Use use, bool fill_reads_source = true);
  Status LoadIntoHost(const ChunkKey& key, size_t len, const FillFn& fill, bool pin);
  Status LoadIntoGpu(const ChunkKey& key, size_t len, const FillFn& fill, bool pin);
  // The chunk's bytes in the resident whole-file copy, or null (with the
  // copy kept alive in `hold`).
  const uint8_t* InResidentFile(const ChunkKey& key, size_t len, FileCache::CopyPtr& hold) const;
  void Demote(const ChunkKey& key, const uint8_t* bytes, size_t len);

  const Options options_;
  // The GPU tier first: the host tier's eviction hook points at it, so it
  // must outlive the host tier.
  std::unique_ptr<GpuChunkTier> gpu_;
  std::unique_ptr<HostChunkTier> host_;
  std::atomic<uint64_t> verification_failures_{0};
  std::atomic<uint64_t> uncached_reads_{0};
  std::atomic<uint64_t> host_copy_fills_{0};
};

}  // namespace ckptfs
