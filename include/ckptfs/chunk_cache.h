// ChunkCache: the chunk path's cache of verified 4 MiB chunks of source
// files, keyed by (file SHA-256, chunk index) so that checkpoints sharing a
// file share its cache entries. The chunks live in HostChunkTier (pinned
// host memory), where reads are served from; a read that misses is filled by
// the caller's fill function (the SourceReader's pread and checks). The
// tier's lock is never held over a fill.
//
// Loads (ckptfsctl preload with fill=off) put a chunk into the tier, pinned
// if asked. When the file is resident whole in the host tier of files
// (FileCache: a sealed copy verified when it was filled), a load copies from
// that copy's mapping instead of reading the source again.
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
#include "ckptfs/file_cache.h"
#include "ckptfs/hashes.h"
#include "ckptfs/host_chunk_tier.h"
#include "ckptfs/status.h"

namespace ckptfs {

struct CacheStats {
  TierStats host;
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
    FileCache* files = nullptr;  // whole verified files that loads may copy from; may be null
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

  // Loads the chunk (if not there) and, with `pin`, keeps it.
  Status Load(const ChunkKey& key, size_t len, const FillFn& fill, bool pin);
  // Unpins every chunk of `file`; returns the bytes unpinned.
  uint64_t Unpin(const Sha256Digest& file);
  // Drops every chunk of `file` not in use right now (pinned or not);
  // returns bytes dropped.
  uint64_t Evict(const Sha256Digest& file);

  Residency ResidentBytes(const Sha256Digest& file) const;
  // Every file with chunks in the cache, in one pass (for stats).
  std::map<Sha256Digest, Residency> ResidencyByFile() const;
  CacheStats Stats() const;
  void CountVerificationFailure();

 private:
  using Use = HostChunkTier::Use;
  Status FillClaimed(const HostChunkTier::Claimed& claimed, size_t len, const FillFn& fill, Use use,
                     bool fill_reads_source = true);
  // The chunk's bytes in the resident whole-file copy, or null (with the
  // copy kept alive in `hold`).
  const uint8_t* InResidentFile(const ChunkKey& key, size_t len, FileCache::CopyPtr& hold) const;

  const Options options_;
  std::unique_ptr<HostChunkTier> host_;
  std::atomic<uint64_t> verification_failures_{0};
  std::atomic<uint64_t> uncached_reads_{0};
  std::atomic<uint64_t> host_copy_fills_{0};
};

}  // namespace ckptfs
