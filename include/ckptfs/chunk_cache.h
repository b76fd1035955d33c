// ChunkCache: the chunk tier, the chunk path's cache of verified 4 MiB
// chunks of source files, keyed by (file SHA-256, chunk index) so that
// checkpoints sharing a file share its entries. The chunks live in chunk
// slots (ChunkSlots: pinned host memory), where reads are served from; a
// read that misses is filled by the caller's fill function (the
// SourceReader's pread and checks). The slots' lock is never held over a
// fill.
//
// Loads (ckptfsctl preload with fill=off) put a chunk into the tier, pinned
// if asked. The tier is composed over the one below it (`below`: the host
// tier): a chunk whose bytes that tier holds (a whole-file copy verified
// when it was filled) is copied from there instead of read from the source.
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

#include "ckptfs/cache_tier.h"
#include "ckptfs/chunk_tier.h"
#include "ckptfs/hashes.h"
#include "ckptfs/status.h"

namespace ckptfs {

class ChunkSlots;  // the chunk tier's memory (src/cache/chunk_slots.h)

struct CacheStats {
  ChunkTierStats slots;
  bool slots_pinned_memory = true;  // false once the kernel refused to lock a slab
  uint64_t verification_failures = 0;
  uint64_t readahead_fills = 0;
  uint64_t readahead_hits = 0;  // chunks filled by read-ahead and then read
  uint64_t preload_fills = 0;   // chunks read from the source by Load (preload)
  uint64_t uncached_reads = 0;  // served from a private buffer: the tier was all pinned or in use
};

class ChunkCache final : public CacheTier {
 public:
  struct Options {
    uint64_t capacity = 1ull << 30;  // bytes of chunk slots
    const CacheTier* below = nullptr;  // the tier loads may copy from; may be null
  };
  // Fills `dst` with `len` verified bytes, or says why it could not.
  using FillFn = std::function<Status(uint8_t* dst, size_t len)>;

  // A read reference to a chunk; the chunk cannot be evicted while a Ref to
  // it lives.
  class Ref {
   public:
    Ref();
    Ref(Ref&& o) noexcept;
    Ref& operator=(Ref&& o) noexcept;
    ~Ref();
    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }

   private:
    friend class ChunkCache;
    ChunkClaim claim_;                   // the chunk in its slot, or
    std::unique_ptr<uint8_t[]> owned_;   // an uncached read's own buffer
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
  };

  explicit ChunkCache(Options options);
  ~ChunkCache() override;
  ChunkCache(const ChunkCache&) = delete;
  ChunkCache& operator=(const ChunkCache&) = delete;

  // The chunk in host memory, filling it if needed. `readahead` marks a fill
  // made ahead of the reader (counted apart).
  Result<Ref> Get(const ChunkKey& key, size_t len, const FillFn& fill, bool readahead = false);

  // Loads the chunk (if not there) and, with `pin`, keeps it.
  Status Load(const ChunkKey& key, size_t len, const FillFn& fill, bool pin);

  // CacheTier. CopyOut copies from the chunks present only.
  const char* name() const override;
  bool CopyOut(const Sha256Digest& file, uint64_t offset, size_t len, uint8_t* dst) const override;
  uint64_t Unpin(const Sha256Digest& file) override;
  uint64_t Evict(const Sha256Digest& file) override;
  std::map<Sha256Digest, Residency> ResidencyByFile() const override;

  Residency ResidentBytes(const Sha256Digest& file) const;
  CacheStats Stats() const;
  void CountVerificationFailure();

 private:
  const Options options_;
  std::unique_ptr<ChunkSlots> slots_;
  std::atomic<uint64_t> verification_failures_{0};
  std::atomic<uint64_t> uncached_reads_{0};
  std::atomic<uint64_t> host_copy_fills_{0};
};

}  // namespace ckptfs
