// What the chunk tier is keyed and counted by: the key of a 4 MiB chunk, the
// tier's counters, and a claim on one chunk slot. The tier itself is
// ChunkCache, its memory the chunk slots (src/cache/chunk_slots.h, private
// to the cache stage: only the claim's shape is public, so that a reader's
// reference to a chunk is held by value, with no allocation per read).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>

#include "ckptfs/hashes.h"

namespace ckptfs {

// Keyed by the file's SHA-256, so checkpoints that share a file share its
// chunks. Ordered by file first: the tier finds a file's chunks as one range.
struct ChunkKey {
  Sha256Digest file{};
  uint32_t index = 0;
  auto operator<=>(const ChunkKey&) const = default;
};

struct ChunkTierStats {
  uint64_t capacity = 0;
  // Bytes of memory held. Every chunk takes a whole 4 MiB slot, even a
  // file's short last chunk (or a small config file).
  uint64_t used = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t fills = 0;       // chunks read from the source
  uint64_t evictions = 0;
  uint64_t pinned = 0;      // bytes
  // Chunks copied from a resident whole-file copy of the host tier
  // (verified when it was filled) instead of read from the source.
  uint64_t fills_from_host_copy = 0;
  // Requests that found their chunk being filled by another and waited for
  // that fill instead of reading the source again (single flight).
  uint64_t fill_waits = 0;
};

struct ChunkSlot;  // one chunk's entry (src/cache/chunk_slots.cpp)
class ChunkSlots;

// A claim on one chunk: a reference to it, present and verified (it is not
// evicted while the claim lives), or an empty slot this caller fills and
// then Commits, after which it is such a reference. Dropped uncommitted,
// the slot goes back and those who waited for the fill claim it again.
class ChunkClaim {
 public:
  // Why a chunk is wanted: a reader's request counts as a hit or a miss;
  // read-ahead and preload fills are counted apart, and only a read-ahead
  // fill that a reader then uses is a read-ahead hit.
  enum class Use { kRead, kReadAhead, kPreload };

  ChunkClaim() = default;
  ChunkClaim(ChunkClaim&& o) noexcept;
  ChunkClaim& operator=(ChunkClaim&& o) noexcept;
  ~ChunkClaim();

  explicit operator bool() const { return entry_ != nullptr; }
  // False: data() is an empty slot for this caller to fill.
  bool present() const { return entry_ != nullptr && !filling_; }
  uint8_t* data() const;
  size_t length() const;  // of the chunk's bytes in the slot
  // Publishes the filled slot. `from_source`: its bytes were read from the
  // source (counted as a fill), not copied from the host tier.
  void Commit(Use use, bool from_source);
  // Keeps the chunk (present) past eviction; see ChunkSlots::CheckPinRoom.
  void Pin();

 private:
  friend class ChunkSlots;
  ChunkClaim(ChunkSlots* slots, ChunkSlot* entry, bool filling) : slots_(slots), entry_(entry), filling_(filling) {}
  void Reset();
  ChunkSlots* slots_ = nullptr;
  ChunkSlot* entry_ = nullptr;
  bool filling_ = false;
};

}  // namespace ckptfs
